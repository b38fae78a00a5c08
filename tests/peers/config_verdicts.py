#!/usr/bin/env python3
"""Which of the ds_config files zero refuses (tests/config/bad) DeepSpeed
accepts: each must be a deliberate refusal, listed with its reason in
tests/peers/refused_by_zero.json (and in README.md's Configuration section).

  config_verdicts.py ZERO_CONFIG BAD_DIR REASONS.json

DeepSpeed's verdict comes in two parts: its config parser and sanity
checks (deepspeed.runtime.config.DeepSpeedConfig on the file's path, at the
world size tests/config/bad/expected.json gives it), then, for a file that
passes them, deepspeed.initialize on a small model in a one-rank group and
one training step (what it checks only when it builds the engine: the
optimizer's name, offload at a given stage, ...; a file without an
optimizer section gets {"type": "AdamW"} added). "trains" means both
passed; "on a GPU" that only an op without a CPU kernel stopped it, and
counts as trains. DeepSpeed's CPU accelerator is granted fp16, as a GPU has
it (below: what this CPU has decides it otherwise). zero's verdict is
`zero-config FILE --world-size N`.
Prints one row per file. Fails when zero accepts one of them (the bad
corpus says it must not), when DeepSpeed trains with one that has no reason
listed, or when a listed one is refused by DeepSpeed too (a stale entry).
Exits 77 (skipped) when deepspeed cannot be imported.
"""
import json
import os
import subprocess
import sys


def main():
    zero_config, bad_dir, reasons_path = sys.argv[1:4]
    os.environ["DS_ACCELERATOR"] = "cpu"  # whatever the shell says: the verdicts are a CPU rank's
    try:
        import deepspeed.comm
        from deepspeed.runtime.config import DeepSpeedConfig
    except Exception as e:
        print(f"SKIPPED: {sys.executable} cannot import deepspeed ({type(e).__name__}: {e})")
        sys.exit(77)
    import logging
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    import torch
    # What decides DeepSpeed 0.19.8's verdict on an fp16 file is this CPU:
    # DeepSpeedEngine._do_sanity_check (deepspeed/runtime/engine.py) first
    # raises "Type fp16 is not supported on your device" when
    # get_accelerator().is_fp16_supported() is false, and the CPU
    # accelerator's (deepspeed/accelerator/cpu_accelerator.py) is
    # torch.ops.mkldnn._is_mkldnn_fp16_supported(): AVX512-FP16 or AMX-FP16,
    # within ONEDNN_MAX_CPU_ISA. Without them DeepSpeed never reached its
    # later checks, the optimizer's name among them (0.19.8 has no 1-bit
    # Adam: onebit_adam_unsupported.json trained "on a GPU" on one machine
    # and was refused at init on another). Granted, every CPU runs them all.
    from deepspeed.accelerator import get_accelerator
    cpu_fp16 = bool(get_accelerator().is_fp16_supported())
    get_accelerator().is_fp16_supported = lambda: True
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("ZERO_VERDICT_PORT", "29533"), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed.ops
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # as bench/deepspeed_peer.py
    deepspeed.init_distributed(dist_backend="gloo")
    real_world_size, real_rank = deepspeed.comm.get_world_size, deepspeed.comm.get_rank

    def trains(path):
        """deepspeed.initialize and one step on a small model: "" or DeepSpeed's error."""
        deepspeed.comm.get_world_size, deepspeed.comm.get_rank = real_world_size, real_rank
        try:
            import hjson  # as DeepSpeed reads the file (comments, trailing commas)
            config = dict(hjson.load(open(path)))
            micro = config.get("train_micro_batch_size_per_gpu", 1)
            micro = micro if isinstance(micro, int) and micro > 0 else 1
            # A file without an optimizer section gets DeepSpeed's AdamW, as a user adds one.
            if "optimizer" not in config:
                config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            x = torch.randn(micro, 8).to(next(engine.module.parameters()).dtype)
            engine.backward(engine(x).float().pow(2).mean())
            engine.step()
            return ""
        except BaseException as e:
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:90]

    expected = json.load(open(os.path.join(bad_dir, "expected.json")))
    reasons = json.load(open(reasons_path))
    failures, accepted_by_deepspeed = [], []
    print(f"fp16 on this CPU (oneDNN): {'yes' if cpu_fp16 else 'no'}; granted to DeepSpeed's CPU accelerator either way")
    print(f"{'file':<48} {'DeepSpeed':<9} {'zero':<8} zero's reason, or DeepSpeed's error")
    for name in sorted(expected):
        path = os.path.join(bad_dir, name)
        world = expected[name].get("world_size", 1)
        # DeepSpeedConfig asks deepspeed.comm for the world size (1 when no group is up).
        deepspeed.comm.get_world_size = lambda *a, **k: world
        deepspeed.comm.get_rank = lambda *a, **k: 0
        try:
            DeepSpeedConfig(path)
            ds_error = trains(path)
            ds_verdict = "trains" if not ds_error else "at init"
            # An op without a CPU kernel says nothing of the file: counted as
            # trained with, so that zero must give a reason.
            if "not been implemented on CPU" in ds_error:
                ds_verdict = "on a GPU"
        except BaseException as e:  # pydantic, ValueError, AssertionError, json errors, SystemExit
            ds_verdict, ds_error = "refuses", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:90]
        zero = subprocess.run([zero_config, path, "--world-size", str(world)], capture_output=True, text=True)
        zero_verdict = "accepts" if zero.returncode == 0 else "refuses"
        note = reasons.get(name, "") if ds_verdict in ("trains", "on a GPU") else ds_error
        print(f"{name:<48} {ds_verdict:<9} {zero_verdict:<8} {note}")
        if zero_verdict == "accepts":
            failures.append(f"zero accepts {name}, which tests/config/bad says it must refuse")
        if ds_verdict in ("trains", "on a GPU"):
            accepted_by_deepspeed.append(name)
            if name not in reasons:
                failures.append(f"DeepSpeed accepts {name} and zero refuses it with no reason in {reasons_path}")
        elif name in reasons:
            failures.append(f"{reasons_path} gives a reason for {name}, but DeepSpeed refuses it too ({ds_error}): "
                            "remove the entry")
    for name in reasons:
        if name not in expected:
            failures.append(f"{reasons_path} names {name}, which is not in {bad_dir}")
    print(f"{len(accepted_by_deepspeed)} of {len(expected)} files zero refuses DeepSpeed trains with, each refused "
          "for the reason given")
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))


if __name__ == "__main__":
    main()
