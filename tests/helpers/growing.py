"""The step of a small training loop that the segment-cache tests' ranks run through the
public API, as source text for their child processes (``work(k, compute_s)``): a data span, a
compute span of ``compute_s`` seconds, a loss metric, a tag every 7 steps, then a flush by hand
(their ranks have no flush on a timer, so that the files stay as they are while a test reads
them)."""

WORK = r"""
import time
import goodtrace as gt

def work(k, compute_s):
    with gt.step(k):
        with gt.span("data", "data"):
            time.sleep(0.0002)
        with gt.span("forward", "compute"):
            time.sleep(compute_s)
        gt.metric("loss", 1.0 / (k + 1), step=k)
        if k % 7 == 0:
            gt.tag("eval_window", step=k)
    gt.flush()
"""
