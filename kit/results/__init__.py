"""From run folders to what a reader sees. Reads run folders through kit.runs only; imports the
layers below it, never the doors. Five rooms, by what the reader gets; each imports only the
rooms above it in this list (tests/test_architecture.py, RESULTS_ROOMS):

- frame: the runs as a frame - collect (run folders -> one row per run), stats (the tests),
  no_runs (NoRuns, 'nothing to show' in one line, and the command that makes the runs)
- tables: build (the tables of runs), paper_table (Tables 2-3), paper_results (the paper's
  numbers), selection, fold_tables, table_sets (a profile's or the results notebook's set),
  writers (md / csv / tex), submission (test predictions checked, Kaggle fold averages),
  glue_zips (GLUE server zips), compare (any run folders, by hand)
- figures: figure_data (the frames), plots (the plots), token_view (labels and runs by name),
  model_scores (per-token scores from a checkpoint), mechanism (the SSA mechanism benchmark's
  tables and figure)
- views: the notebooks' views - run_view (epoch table, loss plot, summary line), model_view,
  token_html (SSA on the tokens), notebook_defaults (which profile / task a notebook shows)
- report: what a batch leaves - profile_outputs (tables and figures as files), page (the HTML
  report), page_header (its facts and warnings)
"""
