"""export writes model folders that transformers loads, from every kind of source, with the real
libraries: a Trainer run of a Llama-config model with its tokenizer (checkpoint-N/ exported
whole: weights, config, generation config and tokenizer files; from_pretrained and
AutoTokenizer load it, every tensor equal); a torch file of a DDP-wrapped, torch.compile'd
model (`module._orig_mod.` names: --strip-prefix) and a torch.distributed.checkpoint folder,
both with --config-from naming the model folder whose config and tokenizer go along."""
import os
import sys
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_VERBOSITY"] = "error"

import torch  # noqa: E402

from real_common import assert_same_object, sha256  # noqa: E402
from stacklib import TempDirTest, run  # noqa: E402


def tokenizer():
    """A word-level tokenizer made in memory (no downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"w{i}": i for i in range(96)}
    vocab["[UNK]"] = 96
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[UNK]")


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(cfg)


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randint(0, 96, (16, 8), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def weights(folder):
    from transformers import LlamaForCausalLM
    m = LlamaForCausalLM.from_pretrained(folder)
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


class ExportModelFolderTest(TempDirTest):
    def setUp(self):
        super().setUp()
        # The model folder a team keeps beside its runs: config, generation config, tokenizer.
        self.model = llama()
        self.model_dir = self.path("base")
        self.model.save_pretrained(self.model_dir)
        tokenizer().save_pretrained(self.model_dir)
        self.want = weights(self.model_dir)

    def assertModelFolder(self, out, want, config_source):
        from transformers import AutoTokenizer
        got = weights(out)
        assert_same_object(self, want, got, out)
        for name in ("config.json", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json"):
            self.assertEqual(sha256(os.path.join(out, name)),
                             sha256(os.path.join(config_source, name)), name)
        tok = AutoTokenizer.from_pretrained(out)
        self.assertEqual(tok("w1 w5 w7")["input_ids"], [1, 5, 7])

    def test_trainer_checkpoint_of_a_llama_exports_to_a_model_folder(self):
        from transformers import Trainer, TrainingArguments
        run_dir = self.path("run")
        args = TrainingArguments(output_dir=run_dir, max_steps=2, save_steps=2,
                                 per_device_train_batch_size=4, report_to=[], use_cpu=True,
                                 disable_tqdm=True, seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Trainer(model=llama(), args=args, train_dataset=Tokens(),
                    processing_class=tokenizer()).train()
        ckpt = os.path.join(run_dir, "checkpoint-2")
        out = self.path("exported")
        run("export", ckpt, "-o", out)
        self.assertNotIn("optimizer.pt", os.listdir(out))
        self.assertModelFolder(out, weights(ckpt), ckpt)
        # bf16 on the way: every tensor as from_pretrained(torch_dtype=bf16) of the checkpoint
        run("export", ckpt, "-o", self.path("bf16"), "--dtype", "bf16")
        got = weights(self.path("bf16"))
        for k, v in weights(ckpt).items():
            self.assertTrue(torch.equal(got[k].float(), v.to(torch.bfloat16).float()), k)

    def test_ddp_compiled_torch_file_with_strip_prefix_and_config_from(self):
        compiled = torch.compile(self.model)  # lazily: state_dict names gain "_orig_mod."
        sd = {"module." + k: v for k, v in compiled.state_dict().items()}
        self.assertTrue(all(k.startswith("module._orig_mod.") for k in sd))
        src = self.path("ddp.pt")
        torch.save({"model": sd, "epoch": 3}, src)
        out = self.path("out")
        # As they are, the names are not the model's (from_pretrained would load none of them).
        run("export", src, "-o", self.path("raw.safetensors"))
        from safetensors.torch import load_file
        self.assertTrue(all(k.startswith("module._orig_mod.")
                            for k in load_file(self.path("raw.safetensors"))))
        run("export", src, "-o", out, "--strip-prefix", "module.", "--strip-prefix",
            "_orig_mod.", "--config-from", self.model_dir)
        self.assertModelFolder(out, self.want, self.model_dir)
        # A prefix that matches nothing is said; a file output cannot take a config.
        r = run("export", src, "-o", self.path("x.safetensors"), "--strip-prefix", "encoder.")
        self.assertIn("--strip-prefix encoder.: no name starts with it", r.stderr)
        r = run("export", src, "-o", self.path("y.safetensors"), "--config-from", self.model_dir,
                expect=1)
        self.assertIn("export into a folder", r.stderr)
        self.assertFalse(os.path.exists(self.path("y.safetensors")))
        r = run("export", src, "-o", self.path("z"), "--config-from", self.path("nowhere"),
                expect=1)
        self.assertIn("no such file or folder", r.stderr)

    def test_dcp_folder_with_config_from(self):
        import torch.distributed.checkpoint as dcp
        src = self.path("dcp")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": self.model.state_dict()}, checkpoint_id=src)
        out = self.path("out")
        run("export", src, "-o", out, "--config-from", self.model_dir)
        self.assertModelFolder(out, self.want, self.model_dir)


if __name__ == "__main__":
    unittest.main()
