"""ssa-kit. Importing it checks the one dependency whose older versions break every forward:
transformers >= 5 (kit.models.attention_mask hands the encoder the 4-D mask transformers 5
builds, which 4.x's BERT, RoBERTa, ELECTRA and DistilBERT's SDPA path reject; whole_word_mask
uses 5's collator). An older one stops here in one line naming both versions, read from the
package's metadata (nothing is imported), rather than in every run's first forward."""
import sys
from importlib import metadata

# papermill -> nbformat -> jsonschema builds lark grammars for its optional IRI format checks when
# rfc3987_syntax is installed (jupyter's extras install it): 0.75 s of every batch's start
# (papermill imports in 1.05 s, 0.29 s without it), 3 s of a report on a small CPU. The kit
# validates notebooks without format checks, so every process that imports kit does without that
# optional module (here, before any kit module can import nbformat).
sys.modules.setdefault("rfc3987_syntax", None)

TRANSFORMERS_MAJOR = 5      # pyproject.toml: transformers>=5


def check_transformers() -> None:
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return          # not installed: the first import of it says so
    major = version.split(".")[0]
    if major.isdigit() and int(major) < TRANSFORMERS_MAJOR:
        raise SystemExit(f"ssa-kit needs transformers >= {TRANSFORMERS_MAJOR}; this Python has "
                         f"transformers {version}: pip install 'transformers>="
                         f"{TRANSFORMERS_MAJOR}' (docs/gpu.md)")


check_transformers()
