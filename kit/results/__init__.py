"""From run folders to what a reader sees. Reads run folders through kit.runs only; imports the
layers below it, never the doors. Its files, by what they make:

- the runs as a frame: collect (run folders -> one row per run), stats (the tests)
- tables: tables (summaries, comparisons, epoch views), paper_table (Tables 2-3 layout),
  paper_results (the paper's numbers), selection (the three-subset rule), fold_tables (k-fold,
  out-of-fold), table_sets (a profile's or the results notebook's set), writers (md / csv /
  tex), submission (GLUE zips, Kaggle fold averages), compare (any run folders, by hand)
- figures: figure_data (the frames), figures (the plots; the kinds are
  kit.config.profiles.FIGURES), token_view (per-token scores from a checkpoint), mechanism (the
  SSA mechanism benchmark's tables and figure), profile_outputs (what a batch writes at its end)
- the report page: page (one HTML page per profile), page_header (its facts and warnings)
- the notebooks' views: views (epoch table, loss plot, summary line), token_html (SSA on the
  tokens, as HTML), model_view (dev predictions, errors, confusion), notebook_defaults (which
  profile / task a notebook shows when none is named)
"""
