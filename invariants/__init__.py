"""mlx-invariants: a regression and invariant harness for MLX serving engines.

Everything installs under this one name, so nothing here can shadow a user's
`engine` or `fuzz` package. The subpackages are layers; each imports only
those below it (docs/layers.md):

    cli, commands     the `invariants` console script            (top)
    mutants           the regression catalogue
    fuzz              the cancellation fuzzer and MLX sentinel
    engine, checker   the reference engine; the static checker   (bottom)
    errors            what every layer may raise at the user
    points            the named points the engine marks and the fuzzer aims at

Importing this package loads nothing else: the pre-commit hook and the
injected sentinel both import it.
"""

__version__ = "0.1.0"
