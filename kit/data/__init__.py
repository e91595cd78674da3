"""Text in, token batches out: the readers of GLUE TSV files, the hub's copy and users' CSV files
(readers, hub, csv_reader, csv_data, folds), the synthetic task, and a run's data pipeline
(pipeline: task data, tokenization, token_cache, length-grouped batches; pretrain_text: a
masked-LM run's text; tensors: a batch padded into torch tensors, the one module here with torch).
Imports kit.config and kit.io only."""
