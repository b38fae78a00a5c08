"""zero from Python, the calls themselves: a small model of its own blocks
trained by zero.initialize at stages 0-3 against torch.optim.AdamW on the
whole batch in this process (the independent reference), checkpoints that
resume, GatheredParameters, and the refusals. Runs alone or under
`zero-run --nproc N` (each rank takes its rows of every batch)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import zero

torch.set_num_threads(1)
BATCH, FEATURES, STEPS = 4, 8, 5
ADAM = {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


class Toy(torch.nn.Module):
    def __init__(self, d=16, blocks=3):
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(blocks))
        self.head = torch.nn.Linear(d, 1)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def toy():
    torch.manual_seed(0)
    return Toy()


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randn(BATCH, 1, generator=g)


def config(stage, **extra):
    c = {"train_micro_batch_size_per_gpu": BATCH // world(), "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": ADAM}, "zero_optimization": {"stage": stage}}
    if stage == 3:
        c["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    c.update(extra)
    return c


def world():
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank():
    return int(os.environ.get("RANK", "0"))


def my_rows(t):
    n = BATCH // world()
    return t[rank() * n:(rank() + 1) * n]


def train(engine, model, steps, first=0):
    """Each step's loss over the whole batch (the mean of the ranks')."""
    losses = []
    for s in range(first, first + steps):
        x, y = batch(s)
        loss = torch.nn.functional.mse_loss(engine(my_rows(x)), my_rows(y))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().double().clone()
        zero.comm.all_reduce(mean)
        losses.append(mean.item() / world())
    return losses


def reference(steps):
    model = toy()
    opt = torch.optim.AdamW(model.parameters(), lr=ADAM["lr"], betas=tuple(ADAM["betas"]), eps=ADAM["eps"],
                            weight_decay=ADAM["weight_decay"])
    losses = []
    for s in range(steps):
        x, y = batch(s)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def shared_dir(name):
    # One folder for every rank of this job (zero-run is the ranks' parent).
    return os.path.join(tempfile.gettempdir(), f"zero-python-{name}-{os.getppid()}")


class SameAsTorch(unittest.TestCase):
    def check_stage(self, stage, **extra):
        want, ref_model = reference(STEPS)
        model = toy()
        engine, optimizer, loader, scheduler = zero.initialize(model=model, model_parameters=model.parameters(),
                                                               config=config(stage, **extra), units=[Block])
        self.assertIsNone(loader)
        self.assertIsNone(scheduler)
        got = train(engine, model, STEPS)
        for s, (g, w) in enumerate(zip(got, want)):
            self.assertAlmostEqual(g, w, delta=1e-5 * abs(w), msg=f"stage {stage}, step {s + 1}")
        # The weights too, gathered (stage 3 holds shards between steps).
        with zero.GatheredParameters(list(model.parameters())):
            for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
                torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5, msg=f"stage {stage}: {name}")
        return engine, model

    def test_stage0(self):
        self.check_stage(0)

    def test_stage1(self):
        self.check_stage(1)

    def test_stage2(self):
        self.check_stage(2)

    def test_stage3_units_released_between_steps(self):
        engine, model = self.check_stage(3)
        # A unit's parameters hold no elements outside its forward (as
        # DeepSpeed's); what is outside every unit stays whole.
        self.assertEqual(model.blocks[0].fc1.weight.numel(), 0)
        self.assertEqual(model.head.weight.numel(), 16)
        report = engine.memory_report()
        self.assertGreater(report["gathered_params_peak"], 0)

    def test_stage3_offload_cpu(self):
        self.check_stage(3, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0,
                                               "offload_optimizer": {"device": "cpu"}})

    def test_stage3_parameter_shared_by_two_units(self):
        # A weight tied between units that do not nest belongs to neither:
        # it stays gathered (as C++'s zero::Unit), and trains as torch does.
        def tied():
            model = toy()
            model.blocks[2].fc1.weight = model.blocks[0].fc1.weight
            return model
        model = tied()
        engine, *_ = zero.initialize(model=model, config=config(3), units=[Block])
        got = train(engine, model, STEPS)
        ref = tied()
        opt = torch.optim.AdamW(ref.parameters(), lr=ADAM["lr"], betas=tuple(ADAM["betas"]), eps=ADAM["eps"],
                                weight_decay=ADAM["weight_decay"])
        for s in range(STEPS):
            x, y = batch(s)
            loss = torch.nn.functional.mse_loss(ref(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            self.assertAlmostEqual(got[s], loss.item(), delta=1e-5 * abs(loss.item()), msg=f"step {s + 1}")
        self.assertEqual(model.blocks[0].fc1.weight.numel(), 512)  # gathered between steps

    def test_stage3_offload_nvme(self):
        nvme = shared_dir("nvme")  # every rank's config names the same folder
        self.check_stage(3, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0,
                                               "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                                               "offload_param": {"device": "nvme", "nvme_path": nvme}})
        zero.comm.barrier()
        if rank() == 0:
            shutil.rmtree(nvme, ignore_errors=True)


class ActivationCheckpointing(unittest.TestCase):
    def test_checkpoint_every_recomputes_units_bit_for_bit(self):
        for stage in (2, 3):
            plain_model = toy()
            plain, *_ = zero.initialize(model=plain_model, config=config(stage), units=[Block])
            want = train(plain, plain_model, 3)
            model = toy()
            c = config(stage, activation_checkpointing={"checkpoint_every": 2})
            engine, *_ = zero.initialize(model=model, config=c, units=[Block])
            counts = [0] * 3  # forward calls of each unit: in forward, and again in backward when recomputed
            for k, b in enumerate(model.blocks):
                b.fc1.register_forward_hook(lambda m, a, o, k=k: counts.__setitem__(k, counts[k] + 1))
            got = train(engine, model, 3)
            self.assertEqual(got, want, f"stage {stage}")
            self.assertEqual(counts, [6, 3, 6], f"stage {stage}: units 0 and 2 recomputed (every 2nd, the first included)")


class Checkpoints(unittest.TestCase):
    def test_resume_continues_the_same_losses(self):
        folder = shared_dir("ckpt")
        model = toy()
        engine, *_ = zero.initialize(model=model, config=config(2), units=[Block])
        train(engine, model, 2)
        engine.save_checkpoint(folder, client_state={"epoch": 7})
        want = train(engine, model, 3, first=2)
        again = toy()
        engine2, *_ = zero.initialize(model=again, config=config(3), units=[Block])  # another stage
        path, state = engine2.load_checkpoint(folder)
        self.assertEqual(state, {"epoch": 7})
        self.assertEqual(os.path.basename(path), "global_step2")
        got = train(engine2, again, 3, first=2)
        for g, w in zip(got, want):
            self.assertAlmostEqual(g, w, delta=1e-6 * abs(w))
        zero.comm.barrier()
        if rank() == 0:
            shutil.rmtree(folder)
        self.assertEqual(engine2.load_checkpoint(shared_dir("none")), (None, None))

    def test_save_16bit_model_writes_the_gathered_weights(self):
        from safetensors.torch import load_file
        folder = shared_dir("16bit")
        model = toy()
        c = config(3)
        c["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        engine, *_ = zero.initialize(model=model, config=c, units=[Block])
        train(engine, model, 2)
        self.assertTrue(engine.save_16bit_model(folder))
        saved = load_file(os.path.join(folder, "model.safetensors"))
        with zero.GatheredParameters(list(model.parameters())):
            want = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.assertEqual(sorted(saved), sorted(want))
        for name, tensor in want.items():
            self.assertTrue(torch.equal(saved[name], tensor), name)
        zero.comm.barrier()
        if rank() == 0:
            shutil.rmtree(folder)


class Gathered(unittest.TestCase):
    def test_modifier_rank_changes_every_rank(self):
        model = toy()
        engine, *_ = zero.initialize(model=model, config=config(3), units=[Block])
        w = model.blocks[1].fc1.weight
        with zero.GatheredParameters(w, modifier_rank=0):
            self.assertEqual(tuple(w.shape), (32, 16))
            if rank() == 0:
                with torch.no_grad():
                    w.fill_(0.5)
        with zero.GatheredParameters(w):
            self.assertTrue(torch.all(w == 0.5).item())
        train(engine, model, 1)


class Mistakes(unittest.TestCase):
    def test_submodule_called_while_released_is_named(self):
        model = toy()
        zero.initialize(model=model, config=config(3), units=[Block])
        self.assertEqual(model.blocks[0].fc1.weight.ds_numel, 512)
        with self.assertRaisesRegex(zero.EngineError, r"blocks\.0\.fc1 was called on its own while its unit blocks\.0"):
            model.blocks[0].fc1(torch.randn(2, 16))
        with zero.GatheredParameters(model.blocks[0].parameters()):
            self.assertEqual(tuple(model.blocks[0].fc1(torch.randn(2, 16)).shape), (2, 32))

    def test_parameter_added_after_initialize_is_named(self):
        model = toy()
        engine, *_ = zero.initialize(model=model, config=config(2), units=[Block])
        model.extra = torch.nn.Parameter(torch.zeros(3))
        x, y = batch(0)
        loss = torch.nn.functional.mse_loss(engine(my_rows(x)), my_rows(y)) + model.extra.sum()
        with self.assertRaisesRegex(zero.EngineError, "parameter extra was added to the model after zero.initialize"):
            engine.backward(loss)


class Inputs(unittest.TestCase):
    def test_training_data_gives_each_rank_its_rows(self):
        rows = torch.arange(16.0).reshape(8, 2)
        engine, _, loader, _ = zero.initialize(model=toy(), config=config(2), units=[Block],
                                               training_data=torch.utils.data.TensorDataset(rows))
        mine = torch.cat([b[0] for b in loader])
        self.assertEqual(loader.batch_size, BATCH // world())
        self.assertEqual(len(mine), 8 // world())
        everyone = torch.zeros(8 // world() * world(), 2)
        zero.comm.all_gather_into_tensor(everyone, mine.contiguous())
        self.assertEqual(sorted(everyone[:, 0].tolist()), rows[:, 0].tolist())  # each row on one rank

    def test_fp16_auto_cast_casts_float_inputs(self):
        model = toy()
        c = config(2, fp16={"enabled": True, "auto_cast": True, "initial_scale_power": 8})
        engine, *_ = zero.initialize(model=model, config=c, units=[Block])
        self.assertEqual(model.head.weight.dtype, torch.float16)
        x, y = batch(0)
        out = engine(my_rows(x))  # float32 in: cast to fp16, as DeepSpeed's auto_cast
        self.assertEqual(out.dtype, torch.float16)
        engine.backward(torch.nn.functional.mse_loss(out.float(), my_rows(y)))
        engine.step()
        c["fp16"]["auto_cast"] = False
        plain, *_ = zero.initialize(model=toy(), config=c, units=[Block])
        with self.assertRaises(RuntimeError):
            plain(my_rows(x))


def transformers_or_none():
    try:
        import transformers
        return transformers
    except ImportError:
        return None


LLAMA_FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "llama", "gqa_untied")


class PartitionedConstruction(unittest.TestCase):
    def test_units_partitioned_as_built_train_as_the_model_built_whole(self):
        with zero.Init(config_dict_or_path=config(3), units=[Block]):
            model = toy()
        # A unit's parameter keeps its shape over one value; the rest is whole.
        self.assertEqual(model.blocks[0].fc1.weight.stride(), (0, 0))
        self.assertEqual(model.head.weight.stride(), (16, 1))
        engine, *_ = zero.initialize(model=model, config=config(3), units=[Block])
        got = train(engine, model, STEPS)
        whole = toy()
        engine2, *_ = zero.initialize(model=whole, config=config(3), units=[Block])
        self.assertEqual(got, train(engine2, whole, STEPS))  # bit for bit

    @unittest.skipUnless(transformers_or_none(), "transformers is not installed (tools/setup-deps.sh with ZERO_TORCH=wheel)")
    def test_transformers_model_built_partitioned_then_loaded_equals_from_pretrained(self):
        import transformers
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        c = config(3)
        hf = transformers.AutoConfig.from_pretrained(LLAMA_FIXTURE, attn_implementation="eager")
        # Its post_init writes every weight again after the layers were
        # partitioned: named, not silently lost.
        with self.assertRaisesRegex(zero.EngineError, "no_init_weights"):
            with zero.Init(config_dict_or_path=c, units=[LlamaDecoderLayer]):
                transformers.LlamaForCausalLM(hf)
        with zero.Init(config_dict_or_path=c, units=[LlamaDecoderLayer]), transformers.initialization.no_init_weights():
            model = transformers.LlamaForCausalLM(hf)
        engine, *_ = zero.initialize(model=model, config=c)
        engine.load_weights(LLAMA_FIXTURE)
        reference = transformers.AutoModelForCausalLM.from_pretrained(LLAMA_FIXTURE, attn_implementation="eager")
        ids = (torch.arange(32).reshape(2, 16) * 7) % hf.vocab_size
        with torch.no_grad():
            self.assertEqual(engine(input_ids=ids, labels=ids).loss.item(),
                             reference(input_ids=ids, labels=ids).loss.item())

    def test_init_needs_its_units(self):
        with self.assertRaisesRegex(ValueError, "units="):
            zero.Init(config_dict_or_path=config(3))
        with self.assertRaisesRegex(NotImplementedError, "module"):
            zero.Init(module=toy(), config_dict_or_path=config(3), units=[Block])


class Refusals(unittest.TestCase):
    def test_client_optimizer_is_named(self):
        model = toy()
        with self.assertRaisesRegex(NotImplementedError, "optimizer"):
            zero.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config(2))

    def test_key_python_cannot_honour_is_named(self):
        c = config(2)
        c["sequence_parallel_size"] = 2
        with self.assertRaisesRegex(zero.ConfigError, "sequence_parallel_size"):
            zero.initialize(model=toy(), config=c)

    def test_config_file_read_as_deepspeed_reads_it(self):
        # hjson's liberties, as DeepSpeed reads its file: comments, a trailing comma.
        path = os.path.join(tempfile.mkdtemp(), "ds.json")
        text = json.dumps(config(2), indent=1)
        with open(path, "w") as f:
            f.write("// a ds_config with a comment\n" + text[:-1].rstrip() + ",\n}\n")
        engine, _, _, scheduler = zero.initialize(model=toy(), config=path, units=[Block])
        self.assertEqual(engine.train_micro_batch_size_per_gpu(), BATCH // world())
        self.assertIsNone(scheduler)
        shutil.rmtree(os.path.dirname(path))

    def test_bad_config_is_a_config_error(self):
        with self.assertRaisesRegex(zero.ConfigError, "stage"):
            zero.initialize(model=toy(), config=config(7))

    def test_other_torch_version_is_one_clear_error(self):
        code = "import torch; torch.__version__ = '0.0.1'; import zero"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("ImportError: zero was built against torch " + zero._build.torch_version, out.stderr)
        self.assertIn("imports torch 0.0.1", out.stderr)


if __name__ == "__main__":
    unittest.main()
