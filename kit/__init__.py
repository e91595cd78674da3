"""ssa-kit: reproduce "Improving BERT with Self-Supervised Attention" and its siblings on GLUE."""
import sys

# papermill -> nbformat -> jsonschema builds lark grammars for its optional IRI format checks when
# rfc3987_syntax is installed (jupyter's extras install it): 0.75 s of every batch's start
# (papermill imports in 1.05 s, 0.29 s without it), 3 s of a report on a small CPU. The kit
# validates notebooks without format checks, so every process that imports kit does without that
# optional module (here, before any kit module can import nbformat).
sys.modules.setdefault("rfc3987_syntax", None)
