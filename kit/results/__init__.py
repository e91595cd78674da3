"""From run folders to what a reader sees: runs collected into a frame (collect), tables
(tables, paper_table, selection, fold_tables, table_sets, writers, stats), figures (figure_data,
figures, token_view, mechanism, views), the notebooks' views of runs (token_html: SSA on the
tokens; model_view: dev predictions; compare: run folders by hand), GLUE / Kaggle submissions
(submission) and the report, one HTML page per profile (page, page_header).
Reads run folders through kit.runs only; imports the layers below it, never the doors."""
