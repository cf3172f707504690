"""CPU seconds of a set of processes (user + system, from /proc/<pid>/stat), for the Python
peers that time a main process and its DataLoader workers together."""
import os


def cpu_seconds(pids):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        total += (int(rest[11]) + int(rest[12])) / tick
    return total
