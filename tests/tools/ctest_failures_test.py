#!/usr/bin/env python3
"""ctest ctest_failures: scripts/ctest_failures.py on a synthetic Testing/Temporary folder (what
ctest writes): of two tests, the failed one's last lines are printed, the passed one's are not,
long outputs keep only their end, and a folder without failures prints nothing."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ctest_failures.py")


def entry(index, name, output, passed):
    return (f"{index}/2 Testing: {name}\n{index}/2 Test: {name}\nCommand: \"/bin/{name}\"\n"
            f"Directory: /tmp\n\"{name}\" start time: Dec 04 17:38 UTC\nOutput:\n"
            f"----------------------------------------------------------\n{output}"
            f"<end of output>\nTest time =   1.00 sec\n"
            f"----------------------------------------------------------\n"
            f"Test {'Passed' if passed else 'Failed'}.\n\"{name}\" end time: Dec 04 17:38 UTC\n"
            f"\"{name}\" time elapsed: 00:00:01\n"
            f"----------------------------------------------------------\n\n")


def run(build, *args):
    result = subprocess.run([sys.executable, SCRIPT, build, *args], capture_output=True,
                            text=True, check=True)
    return result.stdout


def main():
    with tempfile.TemporaryDirectory() as build:
        temporary = os.path.join(build, "Testing", "Temporary")
        os.makedirs(temporary)
        assert run(build) == "", "no logs: nothing to say"
        failed_output = "".join(f"line {i}\n" for i in range(100)) + "FAIL schema #7: not JSON\n"
        with open(os.path.join(temporary, "LastTest.log"), "w") as f:
            f.write("Start testing: Dec 04 17:38 UTC\n"
                    "----------------------------------------------------------\n")
            f.write(entry(1, "quiet_test", "all good\n", True))
            f.write(entry(2, "structured_output", failed_output, False))
        with open(os.path.join(temporary, "LastTestsFailed.log"), "w") as f:
            f.write("2:structured_output\n")
        out = run(build, "--lines", "5")
        assert "1 failed: structured_output" in out, out
        assert "FAIL schema #7: not JSON" in out, out
        assert "line 96" in out and "line 95" not in out, out  # the last 5 lines only
        assert "all good" not in out, out
        os.remove(os.path.join(temporary, "LastTestsFailed.log"))
        assert run(build) == "", "no failures: nothing to say"
    print("ok ctest_failures: a failed test's last lines, nothing of the passed one")


if __name__ == "__main__":
    main()
