"""Errors of `invariants mutants`.

    MutantsError
    ├── NoLongerApplies   a mutant's anchor is gone from the engine: update the catalogue
    └── UnknownMutant     `--only` named no mutant
"""

from __future__ import annotations


class MutantsError(Exception):
    pass


class NoLongerApplies(MutantsError):
    def __init__(self, mutant_id: str, why: str):
        super().__init__(f"mutant {mutant_id} no longer applies: engine changed: {why}\n"
                         f"Update its edits in invariants/mutants/catalogue.py to the engine's new code.")
        self.mutant_id = mutant_id


class UnknownMutant(MutantsError):
    pass
