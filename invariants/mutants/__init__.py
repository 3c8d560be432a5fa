"""The mutation catalogue: known regressions of MLX serving engines, applied to copies of engine/.

Nothing heavy is imported here: `invariants.cli` imports the command module
when it builds its parser.
"""

from invariants.mutants.catalogue import CATALOGUE, select
from invariants.mutants.errors import MutantsError, NoLongerApplies, UnknownMutant
from invariants.mutants.mutant import Edit, Mutant

__all__ = ["CATALOGUE", "Edit", "Mutant", "MutantsError", "NoLongerApplies", "UnknownMutant", "select"]
