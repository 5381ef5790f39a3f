"""The test process's own exit (tests/conftest.py): pytest's exit code stands, its report is printed
whole, and a crash in the interpreter's finalisation, where CI's run of 2026-12-02 died, is never reached."""
import subprocess
import sys

import pytest

from tests.helpers import ROOT

TESTS = {
    "passing": "def test_ok():\n    assert True\n",
    "failing": "def test_broken():\n    assert False\n",
    # the stand-in for a native thread that faults once the interpreter finalises
    "crash_at_exit": ("import atexit, os, signal\n\natexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))\n\n\n"
                      "def test_ok():\n    assert True\n"),
}


def run_pytest(tmp_path, name, with_conftest=True):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / f"test_{name}.py").write_text(TESTS[name])
    plugin = ["-p", "tests.conftest"] if with_conftest else []
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin,
                           "-c", str(tmp_path / "pytest.ini"), str(tmp_path / f"test_{name}.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name, code, summary", [("passing", 0, "1 passed"), ("failing", 1, "1 failed"),
                                                 ("crash_at_exit", 0, "1 passed")])
def test_pytest_exit_code_and_report_stand(tmp_path, name, code, summary):
    out = run_pytest(tmp_path, name)
    assert out.returncode == code, out.stdout + out.stderr
    assert summary in out.stdout.splitlines()[-1]


def test_the_crash_stand_in_does_crash_without_the_conftest(tmp_path):
    assert run_pytest(tmp_path, "crash_at_exit", with_conftest=False).returncode == -11
