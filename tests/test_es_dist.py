"""The same seed gives the same noise and the same update in another process and in a Ray actor."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from coevo.es import ESParams, es_update, generate_noise, perturb

NAMES = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight"]


def probe(threads: int | None = None) -> dict[str, str]:
    """Digests of noise for a few (seed, name) pairs and of weights after perturb + restore + update."""
    if threads is not None:
        torch.set_num_threads(threads)
    out = {}
    for seed in (0, 2024, 2**63 - 1):
        for name in NAMES:
            eps = generate_noise(seed, name, (257, 129))
            out[f"{seed}:{name}"] = hashlib.sha256(eps.numpy().tobytes()).hexdigest()
    g = torch.Generator().manual_seed(1)
    pairs = [(n, torch.randn(300, 200, generator=g).to(torch.bfloat16)) for n in NAMES]
    params = ESParams(pairs, master_dtype=torch.float32)
    with perturb(params, 77, 1e-3, sign=-1):
        pass
    es_update(params, [5, 5, 6], [1, -1, 1], [0.3, -1.1, 0.8], alpha=5e-4, sigma=1e-3)
    out["weights"] = params.weights_hash()
    return out


def test_same_noise_in_a_separate_process():
    code = (
        f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_es_dist import probe; print(json.dumps(probe(threads=1)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    remote = json.loads(proc.stdout.strip().splitlines()[-1])
    assert remote == probe()
    assert len(set(remote.values())) == len(remote)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.slow  # ~15 s on 2 shared cores (Ray start-up)
def test_same_noise_in_a_ray_actor():
    ray = pytest.importorskip("ray")
    t0 = time.perf_counter()
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}},
    )
    try:

        @ray.remote(num_cpus=1)
        class NoiseActor:
            def probe(self) -> dict[str, str]:
                from test_es_dist import probe as remote_probe

                return remote_probe()

        actor = NoiseActor.remote()
        remote = ray.get(actor.probe.remote(), timeout=300)
    finally:
        ray.shutdown()
    print(f"\nray round trip {time.perf_counter() - t0:.1f} s")
    assert remote == probe()
