"""Findings in defs their package never names are left out (checker/model/unreferenced.py), and
only those: a framework's hooks, registrations, public functions and anything named stay judged."""

from __future__ import annotations

from tests.invariants.conftest import Project

# A blocking forward pass on the loop (INV108) in a method of a class the package builds.
TIER = '''
class Tier:
    def __init__(self, model):
        self.model = model

    async def read(self, tokens):
        return self.model(tokens)
'''
# The scheduler builds the tier; `promote` is the only code that names `read`.
SCHEDULER = '''
from .tier import Tier


class Scheduler:
    def __init__(self, model):
        self.tier = Tier(model)

    async def promote(self, tokens):
        return await self.tier.read(tokens)
'''
SERVER = '''
from .scheduler import Scheduler


class Server:
    def __init__(self, model):
        self.scheduler = Scheduler(model)
'''


def _package(project: Project, server: str = SERVER) -> None:
    project.write("srv/__init__.py", "")
    project.write("srv/tier.py", TIER)
    project.write("srv/scheduler.py", SCHEDULER)
    project.write("srv/server.py", server)


def test_a_def_named_only_inside_unreferenced_defs_is_not_reported(project: Project) -> None:
    _package(project)
    assert project.run("check", "srv").rules() == []
    _package(project, SERVER + "\n    async def warm(self, tokens):\n        await self.scheduler.promote(tokens)\n")
    assert [line.split(": ", 1)[0] for line in project.run("check", "srv").lines()] == ["srv/tier.py:6:16"]


def test_report_unreferenced_reports_them_as_a_library_needs(project: Project) -> None:
    _package(project)
    project.config("report-unreferenced = true\n")
    assert project.run("check", "srv").rules() == ["INV108"]


def test_one_file_given_is_judged_against_its_whole_package(project: Project) -> None:
    """As the pre-commit hook runs it: the caller is in a file the run was not given; an edit
    there is seen by the next run, through the kept answer."""
    _package(project)
    assert project.run("check", "srv/tier.py").rules() == []
    project.write("srv/routes.py", "async def warm(scheduler, tokens):\n    await scheduler.promote(tokens)\n")
    assert project.run("check", "srv/tier.py").rules() == ["INV108"]


def test_hooks_registrations_public_functions_and_unnamed_classes_stay_reported(project: Project) -> None:
    project.write("srv/__init__.py", "")
    project.write("srv/handlers.py", '''
        from grpc_stubs import EngineServicer
        from .app import app


        class Servicer(EngineServicer):
            def __init__(self, model):
                self.model = model

            async def Generate(self, request, context):
                return self.model(request.tokens)


        @app.post("/v1/embed")
        async def _embed(model, tokens):
            return model(tokens)


        async def serve_once(model, tokens):
            return model(tokens)


        class Unnamed:
            async def run(self, tokens):
                return self.model(tokens)


        def build(model):
            return Servicer(model)
    ''')
    project.write("srv/app.py", "app = object()\n")
    lines = [line.split(": ", 1)[0] for line in project.run("check", "srv").lines()]
    assert lines == ["srv/handlers.py:10:16", "srv/handlers.py:15:12", "srv/handlers.py:19:12",
                     "srv/handlers.py:24:16"]


def test_a_suppression_inside_an_unreferenced_def_is_not_called_unused(project: Project) -> None:
    project.write("srv/__init__.py", "")
    project.write("srv/tier.py", TIER.replace("self.model(tokens)", "self.model(tokens)  # noqa: INV108"))
    project.write("srv/scheduler.py", SCHEDULER)
    project.write("srv/server.py", SERVER)
    assert project.run("check", "--report-unused-suppressions", "srv").rules() == []


# A legacy copy left at the package's top when the code moved into `srv/engine/`: its `..api` is above `srv`.
LEGACY = '''
from ..api import clean
import mlx.core as mx


async def generate(tokens):
    return clean(mx.eval(tokens))
'''


def test_a_module_whose_relative_import_climbs_above_its_package_is_not_reported(project: Project) -> None:
    """It cannot be imported (ImportError: beyond top-level package), so none of its code runs; the same
    code one level down, where `..api` resolves, is judged."""
    project.write("srv/__init__.py", "")
    project.write("srv/api/__init__.py", "def clean(x):\n    return x\n")
    project.write("srv/engine/__init__.py", "from .live import generate\n")
    project.write("srv/engine/live.py", LEGACY)
    project.write("srv/legacy.py", LEGACY)
    assert [line.split(": ", 1)[0] for line in project.run("check", "srv").lines()] == ["srv/engine/live.py:6:18"]
    project.config("report-unreferenced = true\n")  # a library's users may import what the package never does
    assert len(project.run("check", "srv").lines()) == 2


def test_the_outlines_kept_between_runs_answer_as_a_fresh_parse(project: Project) -> None:
    """Each file's defs are kept by content digest (model/outline.py): after an edit only the edited
    file is parsed, an edit that moves or revives a finding shows it, and a corrupt cache is rebuilt."""
    warm = "\n    async def warm(self, tokens):\n        await self.scheduler.promote(tokens)\n"
    _package(project)
    assert project.run("check", "srv").rules() == []
    assert list((project.root / ".invariants_cache").glob("outlines-*.json"))
    _package(project, SERVER + warm)
    assert [line.split(": ", 1)[0] for line in project.run("check", "srv").lines()] == ["srv/tier.py:6:16"]
    project.write("srv/tier.py", "# moved down a line\n" + TIER.lstrip("\n"))
    assert [line.split(": ", 1)[0] for line in project.run("check", "srv").lines()] == ["srv/tier.py:7:16"]
    for kept in (project.root / ".invariants_cache").glob("*-*"):
        kept.write_bytes(b"\xfb{not a cache")
    _package(project)
    assert project.run("check", "srv").rules() == []
    _package(project, SERVER + warm)
    assert project.run("check", "srv").rules() == ["INV108"]
