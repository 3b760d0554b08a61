"""Steps more than one job runs, each reading the job configs it serves: encode (evaluate, export),
final_model (finetune, export), dev (the fine-tuning's development scoring, the BM25 baseline) and
baselines (the BM25 and fusion stages of the reproduction)."""
