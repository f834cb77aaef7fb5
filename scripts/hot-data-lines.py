#!/usr/bin/env python3
"""The 64-byte lines of data a program touches on every request, from a valgrind memory trace.

The companion of hot-code-lines.py, for the data side: a request whose data (its stack, the
structures it reads, the buffers it writes) spreads over more lines needs more of the
processor's 32 KB data cache, and once a set of that cache holds more lines than it has ways,
they evict each other on every request. Make the trace with lackey, on a few hundred requests
(it is slow and large: about 70 MB for 220 requests of the layer bench):

    valgrind --tool=lackey --trace-mem=yes --log-file=TRACE target/release/deps/layer-HASH \\
        --iters 200 --rounds 1 --only "=tollgate, 1 limit"
    scripts/hot-data-lines.py TRACE target/release/deps/layer-HASH [TOP] [MARKER]

A request starts each time the program runs the first instruction of the function whose name
holds MARKER (default `Router<S>::call_with_state`, axum's router, which every row of the layer
bench goes through once a request). A line counts when at least half of the last 100 whole
requests touched it; it is attributed to the function whose instruction touched it first in
the last request that touched it (a library's function is shown as "(shared library)"). Lines above
0x1000000000 are the stack (valgrind puts the main thread's stack there). Prints the count,
the part of it on the stack, the most lines any one of the cache's 64 sets holds and how many
sets hold more than its 8 ways, then the TOP functions (default 30) by lines.
"""

import bisect
import collections
import signal
import subprocess
import sys

WINDOW = 100
STACK_FROM = 0x1000000000
# Where valgrind maps a position-independent executable.
BASES = (0x108000, 0x0, 0x400000, 0x4000000)


def symbols(binary):
    out = subprocess.run(
        ["nm", "-C", "--defined-only", binary], capture_output=True, text=True, check=True
    ).stdout
    table = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            table.append((int(parts[0], 16), parts[2]))
    table.sort()
    return table


def main() -> None:
    # quiet when the output is cut short (piped into head)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    trace, binary = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    marker = sys.argv[4] if len(sys.argv) > 4 else "Router<S>::call_with_state"
    table = symbols(binary)
    starts = [address for address, _ in table]
    offsets = [address for address, name in table if marker in name]
    if not offsets:
        sys.exit(f"no function of {binary} has {marker!r} in its name")
    end_of_text = table[-1][0] + 0x100000

    # Pass 1: which base puts the marker on instructions the trace runs.
    candidates = {base + offset: base for base in BASES for offset in offsets}
    hits = collections.Counter()
    with open(trace, errors="replace") as f:
        for line in f:
            if line.startswith("I"):
                address = int(line.split()[1].split(",")[0], 16)
                if address in candidates:
                    hits[candidates[address]] += 1
    if not hits:
        sys.exit(f"the trace never runs {marker!r}")
    base = hits.most_common(1)[0][0]
    entries = {base + offset for offset in offsets}

    def owner(address):
        offset = address - base
        if not 0 <= offset < end_of_text:
            return "(shared library)"
        i = bisect.bisect_right(starts, offset) - 1
        return table[i][1] if i >= 0 else "?"

    # Pass 2: the lines each request touches, and who touched each first.
    touched = collections.deque()  # per whole request: its lines
    counts = collections.Counter()  # line -> requests of the window that touched it
    current, who = None, {}
    instruction = 0
    with open(trace, errors="replace") as f:
        for line in f:
            if line.startswith("I"):
                instruction = int(line.split()[1].split(",")[0], 16)
                if instruction in entries:
                    if current is not None:
                        who.update(current)
                        touched.append(current)
                        counts.update(current.keys())
                        if len(touched) > WINDOW:
                            counts.subtract(touched.popleft().keys())
                    current = {}
            elif current is not None and line[:2] in (" L", " S", " M"):
                data = int(line.split()[1].split(",")[0], 16) >> 6
                if data not in current:
                    current[data] = instruction
    if len(touched) < WINDOW:
        sys.exit(f"only {len(touched)} whole requests in the trace: trace at least {WINDOW + 2}")
    hot = [data for data, n in counts.items() if 2 * n >= WINDOW]
    stack = sum(1 for data in hot if data << 6 >= STACK_FROM)
    sets = collections.Counter(data & 63 for data in hot)
    print(
        f"data lines touched by every request: {len(hot)} ({len(hot) * 64} bytes), "
        f"{stack} of them on the stack; most lines in one cache set: {max(sets.values())}, "
        f"sets over 8 lines: {sum(1 for n in sets.values() if n > 8)}"
    )
    by_function = collections.Counter(
        "(stack)" if data << 6 >= STACK_FROM else owner(who[data])
        for data in hot
    )
    for function, lines in by_function.most_common(top):
        print(f"{lines:5d}  {function[:150]}")


if __name__ == "__main__":
    main()
