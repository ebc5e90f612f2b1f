"""A causal LM's log-likelihood of whole programs, for ranking candidate edits and for membership tests.

    scorer = LMScorer(path)                                   # any local HF checkpoint (the base)
    scorer.edit_scores(source, line, [patched_1, patched_2])  # log p(patched program), one per edit
    scorer.token_logprobs("def f(x):\\n    return x\\n")        # per-token log-probabilities

Candidate edits of one line share every token before that line, so those ids are run once and
their KV cache is repeated across batches of the candidates' remaining ids: the cost of a line is
one prefix plus the suffixes, not one whole program per candidate (`share_prefix=False` runs each
whole; the tests check both give the same scores). Each program is tokenised whole, so the score
is exactly the sum of its tokens' log-probabilities after a fixed header (HEADER), and programs
of different lines compare on one scale.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

HEADER = "```python\n"      # what precedes a program: the first code token is predicted, not given
BATCH = 8                    # suffixes per forward (memory is O(batch x suffix x vocab) for the logits)


class LMScorer:
    def __init__(self, path: str | Path | None = None, *, threads: int | None = None, batch: int = BATCH,
                 model=None, tokenizer=None):
        """From a local checkpoint folder, or an in-memory `model` + `tokenizer` (tests, trainers)."""
        from ratchet.training.quiet import quiet_libraries

        if model is None or tokenizer is None:
            from ratchet.policy.embedded.model import load_policy
            quiet_libraries()
            model, tokenizer = load_policy(path)
        self.path = str(path) if path is not None else None
        self.model, self.tok = model, tokenizer
        self.model.eval()
        self.threads, self.batch = threads, batch
        self._memo: dict = {}

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def token_logprobs(self, text: str) -> list[float]:
        """log p(token_i | header, tokens < i) for each token of `text`."""
        import torch

        head, ids = self._ids(HEADER), self._ids(text)
        with self._threads(), torch.inference_mode():
            logits = self.model(torch.tensor([head + ids])).logits[0].float()
        lp = torch.log_softmax(logits[len(head) - 1:-1], -1)
        return lp.gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1).tolist()

    def edit_scores(self, source: str, line: int, patched: list[str], *, share_prefix: bool = True) -> list[float]:
        """log p(program) of each patched version of `source` (the edits of one line: they share
        every token before it). Exact either way: each program is tokenised whole, and the ids all
        of them start with are run once (`share_prefix=False`: each program alone)."""
        key = (hashlib.sha256(source.encode()).hexdigest(), line,
               hashlib.sha256("\0".join(patched).encode()).hexdigest(), share_prefix)
        if key not in self._memo:      # a harness agent replays its program every turn: score once
            head = self._ids(HEADER)
            ids = [head + self._ids(p) for p in patched]
            self._memo[key] = self.sequence_scores(ids) if share_prefix else \
                [s for one in ids for s in self.sequence_scores([one])]
        return list(self._memo[key])

    def sequence_scores(self, seqs: list[list[int]]) -> list[float]:
        """sum of log p(id_t | ids < t) over t past the header, for each id sequence (each starts with
        the header's ids, tokenised apart, as `token_logprobs` does): the ids every
        sequence starts with go through the model once, their KV cache is repeated over batches of
        the remaining ids."""
        import copy

        import torch

        if not seqs:
            return []
        n_head = len(self._ids(HEADER))
        common = min(len(s) for s in seqs) - 1          # at least one id of each is scored past it
        for i in range(common):
            if any(s[i] != seqs[0][i] for s in seqs):
                common = i
                break
        if any(s[:n_head] != seqs[0][:n_head] for s in seqs) or common < n_head:
            raise ValueError("every sequence must start with the header's ids and hold at least one more")
        pre = seqs[0][:common]
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        scores = []
        with self._threads(), torch.inference_mode():
            out = self.model(torch.tensor([pre]), use_cache=True)
            lp_pre = torch.log_softmax(out.logits[0].float(), -1)
            pre_lp = float(lp_pre[n_head - 1:-1].gather(1, torch.tensor(pre[n_head:]).unsqueeze(1)).sum()) \
                if common > n_head else 0.0
            last = lp_pre[-1]
            for at in range(0, len(seqs), self.batch):
                chunk = [s[common:] for s in seqs[at:at + self.batch]]
                width = max(map(len, chunk))
                ids = torch.tensor([s + [pad] * (width - len(s)) for s in chunk])
                mask = torch.tensor([[1] * common + [1] * len(s) + [0] * (width - len(s)) for s in chunk])
                cache = copy.deepcopy(out.past_key_values)
                cache.batch_repeat_interleave(len(chunk))
                logits = self.model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits.float()
                lp = torch.log_softmax(logits, -1)
                for j, s in enumerate(chunk):
                    total = pre_lp + float(last[s[0]])
                    if len(s) > 1:
                        total += float(lp[j, :len(s) - 1].gather(1, torch.tensor(s[1:]).unsqueeze(1)).sum())
                    scores.append(total)
        return scores

    def _threads(self):
        """As the engine does (TransformersPolicy.generate): the thread count, when one is set,
        applies from the call on."""
        import contextlib

        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        return contextlib.nullcontext()


@functools.lru_cache(maxsize=2)
def scorer_for(path: str) -> LMScorer:
    """One scorer per checkpoint per process (the harness policy is made per evaluation job)."""
    return LMScorer(path)
