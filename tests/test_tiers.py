"""The test tiers (tests/support/tiers.py): a test with no tier or two stops the run, and each test runs
under its tier's timeout unless it sets its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiers import TIMEOUT_S

pytestmark = pytest.mark.unit

MARKERS = ("[pytest]\nasyncio_default_fixture_loop_scope = function\n"
           "markers =\n    unit: u\n    prefect: p\n    system: s\n")


def test_a_test_with_no_tier_or_two_stops_the_run_naming_each(pytester: pytest.Pytester):
    pytester.makeini(MARKERS)
    pytester.makepyfile(test_tiers_example="""
        import pytest

        pytestmark = pytest.mark.unit

        def test_one_tier():
            pass

        @pytest.mark.system
        def test_two_tiers():
            pass

        @pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.prefect)])
        def test_two_tiers_in_one_parameter(x):
            pass
        """)
    pytester.makepyfile(test_untiered="def test_no_tier():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "tests.support.tiers", "-m", "unit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*each test needs exactly one tier marker*",
                                 "*test_tiers_example.py::test_two_tiers: system, unit",
                                 "*test_tiers_example.py::test_two_tiers_in_one_parameter[[]2[]]: prefect, unit",
                                 "*test_untiered.py::test_no_tier: no tier"])
    named = result.stderr.str()
    assert "test_one_tier" not in named and "test_two_tiers_in_one_parameter[1]" not in named


def test_each_test_gets_its_tiers_timeout_unless_it_sets_its_own(pytester: pytest.Pytester):
    pytester.makeini(MARKERS)
    pytester.makepyfile(test_timeouts=f"""
        import pytest

        def timeout(request):
            return request.node.get_closest_marker("timeout").args[0]

        @pytest.mark.unit
        def test_unit(request):
            assert timeout(request) == {TIMEOUT_S["unit"]}

        @pytest.mark.system
        def test_system(request):
            assert timeout(request) == {TIMEOUT_S["system"]}

        @pytest.mark.unit
        @pytest.mark.timeout(42)
        def test_its_own(request):
            assert timeout(request) == 42
        """)
    pytester.runpytest_inprocess("-p", "tests.support.tiers").assert_outcomes(passed=3)


def test_the_tiers_are_the_markers_pyproject_registers(pytestconfig: pytest.Config):
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert set(TIMEOUT_S) <= registered


def test_tests_sharing_a_module_fixture_and_the_model_tests_are_each_one_xdist_group(pytester: pytest.Pytester):
    pytester.makeini(MARKERS + "    smollm2: m\n    serial: s\n")
    pytester.makepyfile(test_groups="""
        import pytest

        from tests.support.tiers import MODEL_LANES

        pytestmark = pytest.mark.system

        @pytest.fixture(scope="module")
        def server():
            return "shared"

        @pytest.fixture(scope="session")
        def engine():
            return "per session"

        def groups(request):
            return [mark.args for mark in request.node.iter_markers("xdist_group")]

        def test_uses_the_module_fixture(request, server):
            assert groups(request) == [("test_groups.py",)]

        def test_uses_a_session_fixture_only(request, engine):
            assert groups(request) == []

        @pytest.mark.smollm2
        def test_runs_the_model(request, server):
            assert groups(request) == [("smollm2-0",)]

        @pytest.mark.smollm2
        def test_runs_the_model_too(request):
            assert groups(request) == [(f"smollm2-{1 % MODEL_LANES}",)]
        """)
    pytester.runpytest_inprocess("-p", "tests.support.tiers").assert_outcomes(passed=4)


def test_under_xdist_a_group_runs_in_one_worker(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """The groups above work only if pytest-xdist honours them (pytest 9.2 with xdist 3.8 silently did
    not: every test of a group went to any worker)."""
    pytester.makeini(MARKERS + "    smollm2: m\n    serial: s\n")
    pytester.makepyfile(test_spread="""
        import os
        import pytest

        pytestmark = pytest.mark.system

        @pytest.fixture(scope="module")
        def server():
            return "shared"

        @pytest.mark.parametrize("n", range(6))
        def test_in_the_group(n, server, tmp_path_factory):
            out = tmp_path_factory.getbasetemp().parent.parent / f"worker-{n}"
            out.write_text(os.environ["PYTEST_XDIST_WORKER"])
        """)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))   # tests.support importable
    result = pytester.runpytest_subprocess("-p", "tests.support.tiers", "-n", "2", "--dist", "loadgroup",
                                           "-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=6)
    workers = {path.read_text() for path in pytester.path.rglob("worker-*")}
    assert len(workers) == 1, workers


def test_the_model_lane_comes_first_then_the_groups_with_most_tests_then_the_rest(pytester: pytest.Pytester):
    """The order xdist hands the work out in (``--no-loadscope-reorder``): the longest chain first."""
    pytester.makeini(MARKERS + "    smollm2: m\n    serial: s\n")
    pytester.makepyfile(test_a_single="import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_alone():\n    pass\n")
    pytester.makepyfile(test_b_small="""
        import pytest

        pytestmark = pytest.mark.system

        @pytest.fixture(scope="module")
        def server():
            return "shared"

        def test_small(server):
            pass
        """)
    pytester.makepyfile(test_c_big="""
        import pytest

        pytestmark = pytest.mark.system

        @pytest.fixture(scope="module")
        def server():
            return "shared"

        @pytest.mark.parametrize("n", range(2))
        def test_big(n, server):
            pass

        @pytest.mark.smollm2
        def test_model():
            pass
        """)
    result = pytester.runpytest_inprocess("-p", "tests.support.tiers", "--collect-only", "-q")
    collected = [line for line in result.outlines if "::" in line]
    assert collected == ["test_c_big.py::test_model", "test_c_big.py::test_big[0]", "test_c_big.py::test_big[1]",
                         "test_b_small.py::test_small", "test_a_single.py::test_alone"]
