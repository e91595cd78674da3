"""Tables from the frame: build (summaries, comparisons, epoch views), paper_table (Tables 2-3
layout), paper_results (the paper's numbers), selection (the three-subset rule), fold_tables
(k-fold, out-of-fold), table_sets (a profile's or the results notebook's set), writers (md / csv
/ tex), submission (test predictions checked, Kaggle fold averages), glue_zips (GLUE server
zips), compare (any run folders, by hand). Imports kit.results.frame only."""
