"""From run folders to what a reader sees: runs collected into a frame (report), tables
(tables, paper_table, selection, fold_tables, table_sets, writers, stats), figures (figure_data,
figures, token_view, mechanism, views) and GLUE / Kaggle submissions (submission).
Reads run folders through kit.runs only; imports the layers below it, never the doors."""
