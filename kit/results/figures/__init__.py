"""Figures from the frame and the tables: figure_data (the frames), plots (the plots; the kinds
are kit.config.profiles.FIGURES), token_view (per-token scores from a checkpoint), mechanism
(the SSA mechanism benchmark's tables and figure). Imports kit.results.frame and .tables."""
