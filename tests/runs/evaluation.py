"""Evaluation passes under torchrun: ``torchrun --nproc_per_node=N evaluation.py OUT``.

Every rank evaluates a float64 tiny Llama on its micro-batches of an
EvaluationBatchSampler and logs each micro-batch (its documents, whether it is a padding
batch) and the reduced result, for two corpora:

* ``corpus``: ``N_EVAL_DOCS`` documents (one of them empty, one of a single token), read by
  a DataLoader worker;
* ``one_document``: a single document, so that every rank but one runs only a padding
  batch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from run_support import Log, documents, start_workers_from_a_fork_server, tiny_llama
from torch.utils.data import DataLoader

from tokenbatch.torch import (
    DocumentLosses,
    EvaluationBatchSampler,
    EvaluationCollator,
    EvaluationDataset,
    EvaluationResult,
    model_inputs,
)

N_EVAL_DOCS = 97
EVAL_MAX_TOKENS = 512


def corpus() -> list[dict[str, list[int]]]:
    """The documents of the pass: document 5 empty, document 9 a single token."""
    docs = documents(N_EVAL_DOCS, seed=3)
    docs[5] = {"input_ids": []}
    docs[9] = {"input_ids": docs[9]["input_ids"][:1]}
    return docs


def evaluate(model: Any, docs: list[dict[str, list[int]]], log: Log, workers: int) -> None:
    sampler = EvaluationBatchSampler([len(d["input_ids"]) for d in docs], EVAL_MAX_TOKENS)
    loader = DataLoader(
        EvaluationDataset(docs),
        batch_sampler=sampler,
        collate_fn=EvaluationCollator(),
        num_workers=workers,
    )
    losses = DocumentLosses(sampler.n_documents)
    with torch.no_grad():
        for batch in loader:
            # Without a cache, Hugging Face models keep attention inside each document of
            # a packed row (they read the documents from position_ids).
            logits = model(**model_inputs(batch), use_cache=False).logits
            losses.add_batch(logits, batch)
            log.write(
                kind="batch",
                docs=batch["document_ids"].tolist(),
                empty_docs=batch["empty_document_ids"].tolist(),
                padding=bool(batch["padding_batch"]),
                labels=int((batch["labels"][0, 1:] != -100).sum()),
            )
    log_result(log, losses.reduce(), steps=len(sampler))


def log_result(log: Log, result: EvaluationResult, **extra: Any) -> None:
    """Record a reduced result (``None`` for the mean of a document without labels)."""
    log.write(
        kind="result",
        loss=result.loss,
        tokens=result.tokens,
        document_losses=[None if x != x else x for x in result.document_losses.tolist()],
        document_tokens=result.document_tokens.tolist(),
        **extra,
    )


def main() -> None:
    start_workers_from_a_fork_server()
    out = Path(sys.argv[1])
    torch.distributed.init_process_group("gloo")
    model = tiny_llama().double().eval()
    evaluate(model, corpus(), Log(out, "corpus"), workers=1)
    evaluate(model, corpus()[:1], Log(out, "one_document"), workers=0)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
