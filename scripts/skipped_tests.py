#!/usr/bin/env python3
"""Says why each test of the last ctest run in BUILD_DIR was skipped: ctest itself prints only
"Skipped". The reason is what the test printed: a GoogleTest skip's message (GTEST_SKIP() <<
"why"), or the last line a script printed before exiting with SKIP_RETURN_CODE.

    skipped_tests.py BUILD_DIR"""

import os
import re
import sys

log = os.path.join(sys.argv[1], "Testing", "Temporary", "LastTest.log")
if not os.path.exists(log):
    sys.exit(0)
text = open(log, encoding="utf-8", errors="replace").read()
# One block per test: its name, its output, and how it ended.
blocks = re.findall(r'^\d+/\d+ Test: (\S+)\n.*?^Output:\n-+\n(.*?)<end of output>\n.*?^Test (\w+)',
                    text, flags=re.S | re.M)
skipped = [(name, out) for name, out, status in blocks if status.lower().startswith("skip")]
if not skipped:
    sys.exit(0)
print(f"{len(skipped)} test(s) skipped:")
for name, out in skipped:
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    reason = ""
    for i, l in enumerate(lines):
        if l.endswith("Skipped") and i + 1 < len(lines):  # GoogleTest: "file:line: Skipped" then the message
            reason = lines[i + 1]
            break
    if not reason and lines:
        reason = next((l for l in reversed(lines) if not l.startswith("[")), lines[-1])
    print(f"  {name}: {reason or '(it printed no reason)'}")
