"""The regression catalogue: known bugs of MLX serving engines (the fuzzer's seed bugs among them),
applied to copies of engine/.

Nothing heavy is imported here: `invariants.cli` imports the command module
when it builds its parser.
"""

from mlx_invariants.mutants.catalogue import CATALOGUE, select
from mlx_invariants.mutants.errors import MutantsError, NoLongerApplies, UnknownMutant
from mlx_invariants.mutants.mutant import Edit, Mutant

__all__ = ["CATALOGUE", "Edit", "Mutant", "MutantsError", "NoLongerApplies", "UnknownMutant", "select"]
