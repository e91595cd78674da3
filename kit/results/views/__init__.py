"""The notebooks' views: run_view (epoch table, loss plot, summary line; a multi-task run's
tables), model_view (dev predictions, errors, confusion), token_html (SSA on the tokens, as
HTML), notebook_defaults (which profile / task a notebook shows when none is named). Imports the
rooms below it (frame, tables, figures), never kit.results.report."""
