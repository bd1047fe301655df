"""Programs shipped to the Ray cluster and run there: today the checkpoint validator.

A NeMo RL run writes ``checkpoint_dir/tmp_step_N/`` and renames it to ``step_N/`` once everything is saved
(``nemo_rl/utils/checkpoint.py``)::

    step_N/config.yaml                  the run's master config (yaml.safe_dump)
    step_N/training_info.json           consumed_samples, current_step, current_epoch, total_steps, ...
    step_N/train_dataloader.pt          the dataloader state (torch.save)
    step_N/policy/weights/              torch.distributed.checkpoint: .metadata + __{rank}_0.distcp per rank
    step_N/policy/optimizer/            the same, for the optimizer state
    step_N/policy/tokenizer/            tokenizer.save_pretrained()

Every byte of a checkpoint is untrusted: whoever can trigger a run or write to its directory controls it. So the
validator never executes checkpoint content. ``.metadata`` (a pickle) is unpickled by the restricted unpickler
(:mod:`.unpickler`), which resolves only the DCP metadata classes and refuses anything else unimported;
``config.yaml`` is parsed as plain YAML with a bound on alias expansion (:mod:`.safe_yaml`); every read is bounded
(:mod:`.limits`, :mod:`.reading`); nothing is read through a symbolic link that leaves the checkpoint directory; and
the shards and ``train_dataloader.pt`` (``torch.load`` pickles) are only sized and hashed, never loaded.

This folder is self-contained: its modules import only each other (relatively), the standard library, PyYAML and,
lazily, torch; never Airflow and never another ``nemo_rl_gke`` module. That is what lets it run in any image that
has torch and PyYAML: the validation job ships the folder as ``remote/`` in its working_dir
(:mod:`nemo_rl_gke.plan.validation`) and runs ``python -m remote validate DIR --expect '{json}'``. It prints one
``CHECKPOINT_REPORT_JSON: {...}`` line (found in the job log with :func:`.report.find_report`) and exits 0 when the
checkpoint is valid, 1 when it is not and 2 on a usage error. Locally: ``python -m nemo_rl_gke.remote validate DIR
--expect-file expect.json --format text``.
"""
