"""Training stages of the embedded policy (no Dagster): the trajectory -> example seam
(`examples`), per-tenant training data from the governed `training_set` (`data`), SFT (`sft`),
DPO (`dpo`) and GRPO pieces (`grpo`). Heavy imports stay inside functions."""
