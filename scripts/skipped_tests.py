#!/usr/bin/env python3
"""Says why each test of the last ctest run in BUILD_DIR was skipped: ctest itself prints only
"Skipped". Which tests were skipped comes from ctest's console output (its "(Skipped)" lines;
its LastTest.log records a skip as "Test Passed."), saved by scripts/test.sh; the reason is what
the test printed: a GoogleTest skip's message (GTEST_SKIP() << "why"), or the last line a script
printed before exiting with SKIP_RETURN_CODE.

    skipped_tests.py BUILD_DIR [CTEST_CONSOLE_OUTPUT]   (default BUILD_DIR/ctest-output.log)"""

import os
import re
import sys

build = sys.argv[1]
console = sys.argv[2] if len(sys.argv) > 2 else os.path.join(build, "ctest-output.log")
log = os.path.join(build, "Testing", "Temporary", "LastTest.log")
if not os.path.exists(log) or not os.path.exists(console):
    sys.exit(0)
names = re.findall(r"^\s*\d+ - (\S+) \(Skipped\)$", open(console, encoding="utf-8", errors="replace").read(),
                   flags=re.M)
if not names:
    sys.exit(0)
text = open(log, encoding="utf-8", errors="replace").read()
outputs = dict(re.findall(r'^\d+/\d+ Test: (\S+)\n.*?^Output:\n-+\n(.*?)<end of output>', text, flags=re.S | re.M))
print(f"{len(names)} test(s) skipped:")
for name in names:
    lines = [l.strip() for l in outputs.get(name, "").splitlines() if l.strip()]
    reason = ""
    for i, l in enumerate(lines):
        if l.endswith("Skipped") and i + 1 < len(lines):  # GoogleTest: "file:line: Skipped" then the message
            reason = lines[i + 1]
            break
    if not reason and lines:
        reason = next((l for l in reversed(lines) if not l.startswith("[")), lines[-1])
    print(f"  {name}: {reason or '(it printed no reason)'}")
