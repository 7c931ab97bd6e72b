#!/usr/bin/python3
"""perf/tools/vs_vllm.py against two stand-ins whose times are known: it must hand vLLM each case's requests,
alternate the programs, take medians and divide the right way. Exits 1 on the first failure."""
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "perf", "tools", "vs_vllm.py")

# Both stand-ins append their arguments to LOG and take their times from the call's index in it, so that
# each run differs and a mean or a last value would give another answer than the median.
UATTN = """#!/usr/bin/python3
import json, os, sys
log = os.environ["LOG"]
n = sum(1 for _ in open(log)) if os.path.exists(log) else 0
open(log, "a").write("uattn " + " ".join(sys.argv[1:]) + "\\n")
case = sys.argv[sys.argv.index("--scenario") + 1]
ms = [10.0, 30.0, 20.0, 25.0, 15.0][n % 5]
print(json.dumps({"kernel_set": "stub", "cases": [
    {"preset": "llama3-8b", "name": case, "ms_1": ms, "ms_all": ms / 2},
    {"preset": "llama3-70b-tp8", "name": case, "ms_1": 1e9, "ms_all": 1e9}]}))
"""
VLLM = """#!/usr/bin/python3
import os, sys
log = os.environ["LOG"]
n = sum(1 for _ in open(log))
open(log, "a").write("vllm " + " ".join(sys.argv[1:]) + "\\n")
print("vllm_cpu_attn %.3f ms" % ([40.0, 50.0, 90.0, 70.0][n % 4] / int(sys.argv[1])))
print("# details")
"""


def stub(dir, name, text):
    path = os.path.join(dir, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def main():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, LOG=os.path.join(d, "log"))
        bench, vllm = stub(d, "uattn-bench", UATTN), stub(d, "vllm", VLLM)
        cmd = [sys.executable, SCRIPT, "--vllm", vllm, "--bench", bench, "--runs", "3", "--threads", "2", "--json",
               "--case", "decode-long 32x4k", "--case", "prefill 2048"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"FAIL: vs_vllm.py exited {r.returncode}: {r.stderr}")
        out = json.loads(r.stdout)
        log = open(env["LOG"]).read().splitlines()

        # the call order: per run, per case, uattn then vLLM at 1 thread then at 2
        who = [line.split()[0] for line in log]
        assert who == ["uattn", "vllm", "vllm"] * 6, who
        decode = [line for line in log if line.startswith("vllm") and "4096:1" in line]
        assert len(decode) == 6 and all(line.split()[7] == ",".join(["4096:1"] * 32) for line in decode), decode
        assert all(line.split()[2:7] == ["3", "128", "32", "8", "128"] for line in log if line.startswith("vllm"))

        # medians over the runs, from the stand-ins' sequences as the calls consumed them
        u = [[10.0, 30.0, 20.0, 25.0, 15.0][i % 5] for i, w in enumerate(who) if w == "uattn"]
        v = [[40.0, 50.0, 90.0, 70.0][i % 4] / int(log[i].split()[1]) for i, w in enumerate(who) if w == "vllm"]
        for k, row in enumerate(out["cases"]):
            u1 = statistics.median(u[k::2])
            v1 = statistics.median(v[2 * k::4])
            vn = statistics.median(v[2 * k + 1::4])
            assert row["uattn_ms_1"] == u1 and row["uattn_ms_all"] == u1 / 2, row
            assert abs(row["vllm_ms_1"] - v1) < 1e-3 and abs(row["vllm_ms_all"] - vn) < 1e-3, row
            assert abs(row["ratio_1"] - row["vllm_ms_1"] / u1) < 1e-9, row
            assert abs(row["ratio_all"] - row["vllm_ms_all"] / (u1 / 2)) < 1e-9, row
        assert out["uattn_kernel_set"] == "stub" and out["vllm_isa"] == "vec"

        # a peer that prints something else is refused with a message, not a traceback
        bad = stub(d, "bad", "#!/bin/sh\necho hello\n")
        r = subprocess.run(cmd[:3] + [bad] + cmd[4:], capture_output=True, text=True, env=env)
        assert r.returncode != 0 and "printed no" in r.stderr and "Traceback" not in r.stderr, r.stderr
    print("vs_vllm: ok")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        sys.exit(f"FAIL: {e}")
