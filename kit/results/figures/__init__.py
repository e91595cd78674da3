"""Figures from the frame and the tables: figure_data (the frames), plots (the plots; the kinds
are kit.config.profiles.FIGURES), token_view (labels and a case study's runs by name),
model_scores (per-token scores from a checkpoint: the one module that runs a model), mechanism
(the SSA mechanism benchmark's tables and figure). Imports kit.results.frame and .tables."""
