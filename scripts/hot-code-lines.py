#!/usr/bin/env python3
"""The 64-byte lines of code a program runs through on every request, from a callgrind profile.

A request's code that does not fit in the processor's instruction cache is fetched again on
every request; this counts how much code that is, and whose. Make the profile with
instruction-level positions, uncompressed names, and note how many requests it covers:

    valgrind --tool=callgrind --dump-instr=yes --compress-strings=no --compress-pos=no \\
        --callgrind-out-file=PROFILE target/release/deps/layer-HASH \\
        --iters 20000 --rounds 1 --only "=tollgate, 1 limit"
    scripts/hot-code-lines.py PROFILE 22000 [TOP]

(the layer bench runs 10% more requests than --iters: its warm-up). A line counts when some
instruction in it ran at least once every two requests; lines are attributed to the function
that owns their first instruction run. Prints the count, then the TOP functions (default 30)
by lines.
"""

import collections
import re
import signal
import sys

# A cost line of an instruction: its address, its source line, then the event count.
COST = re.compile(r"^(0x[0-9a-f]+)\s+\S+\s+(\d+)")


def main() -> None:
    # quiet when the output is cut short (piped into head)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, requests = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    runs = collections.defaultdict(int)  # address -> times its instruction ran
    owner = {}  # address -> function
    function = "?"
    after_call = False
    with open(path, errors="replace") as profile:
        for line in profile:
            if line.startswith("fn="):
                function = line[3:].strip()
            elif line.startswith("calls="):
                # the next cost line is the callee's inclusive cost, not this instruction's
                after_call = True
            else:
                cost = COST.match(line)
                if cost is None:
                    continue
                if after_call:
                    after_call = False
                    continue
                address = int(cost.group(1), 16)
                runs[address] += int(cost.group(2))
                owner.setdefault(address, function)
    hottest = collections.defaultdict(int)  # line -> most runs of one of its instructions
    line_owner = {}
    for address in sorted(runs):
        line = address >> 6
        hottest[line] = max(hottest[line], runs[address])
        line_owner.setdefault(line, owner[address])
    hot = [line for line, n in hottest.items() if 2 * n >= requests]
    print(f"code lines run by every request: {len(hot)} ({len(hot) * 64} bytes)")
    by_function = collections.Counter(line_owner[line] for line in hot)
    for function, lines in by_function.most_common(top):
        print(f"{lines:5d}  {function}")


if __name__ == "__main__":
    main()
