"""One rank of test_build_partitioned.py (started by tests/forked_ranks.py): compare(OUT, CASES).

For every case (a variant's model fields and a dtype, "bf16" or "fp32"): the plain fp32 build
and build_partitioned after the same seed; writes which gathered parameters differ from the
plain ones in that dtype, how many elements this rank holds, and whether the RNG advanced
alike.
"""

import json

import torch
import torch.distributed as dist


def compare(out_path: str, cases: dict) -> None:
    import deepspeed

    from scalelab.jobs.training import distributed
    from scalelab.models.build import build, build_partitioned
    from scalelab.models.config import ModelConfig

    distributed.init(distributed.read_environment())
    report = {}
    for name, (fields, dtype_name) in cases.items():
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
        ds_config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
                     "bf16": {"enabled": dtype_name == "bf16"}}  # fmt: skip
        cfg = ModelConfig.model_validate(
            {"size": "nano", "vocab_size": 300, "block_size": 32, **fields}
        )
        torch.manual_seed(7)
        plain = build(cfg)
        after_plain = torch.get_rng_state()
        torch.manual_seed(7)
        model = build_partitioned(cfg, ds_config)
        same_rng = torch.equal(torch.get_rng_state(), after_plain)
        held = sum(p.ds_tensor.numel() for p in model.parameters())
        whole = sum(p.ds_numel for p in model.parameters())
        want = dict(plain.named_parameters())
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            got = dict(model.named_parameters())
            differ = [k for k in want if k not in got or got[k].dtype != dtype
                      or not torch.equal(got[k], want[k].to(dtype))]  # fmt: skip
            tied = cfg.task != "lm" or model.lm_head.weight is model.wte.weight
            rows = model.wte.weight.shape[0]
        report[name] = {"differ": differ, "keys_match": want.keys() == got.keys(),
                        "same_rng": same_rng, "held": held, "whole": whole, "tied": tied,
                        "rows": rows, "num_params": [model.num_params(), plain.num_params()]}  # fmt: skip
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()
