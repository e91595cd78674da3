"""Tables from the frame: build (summaries, comparisons, epoch views), paper_table (Tables 2-3
layout), paper_results (the paper's numbers), selection (the three-subset rule), fold_tables
(k-fold, out-of-fold), table_sets (a profile's or the results notebook's set), writers (md / csv
/ tex), submission (GLUE zips, Kaggle fold averages), compare (any run folders, by hand). Imports
kit.results.frame only."""
