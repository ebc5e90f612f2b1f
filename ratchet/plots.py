"""PNG charts for asset metadata and MLflow artifacts (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping


def ingest_chart(summary, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    outcome = {"accepted": summary.accepted, "quarantined": summary.quarantined, "duplicates": summary.duplicates}
    a.bar(list(outcome), list(outcome.values()), color=["#2a9d8f", "#e76f51", "#8d99ae"])
    a.set_title(f"ingest {summary.batch_id[:8]}: {summary.read} records read")
    reasons = summary.quarantine_reasons or {"none": 0}
    b.barh(list(reasons), list(reasons.values()), color="#e76f51")
    b.set_title("quarantine reasons")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def cluster_chart(hist: Mapping[str, int], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(list(hist), list(hist.values()), color="#457b9d")
    ax.set_xlabel("cluster size (items)")
    ax.set_ylabel("clusters")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def markdown_image(path: Path, alt: str = "chart") -> str:
    """A PNG as Markdown with the image inline (a data URI): asset metadata then shows the chart
    itself in the Dagster UI, not a path, and it survives RATCHET_HOME moving."""
    import base64

    return f"![{alt}](data:image/png;base64,{base64.b64encode(Path(path).read_bytes()).decode()})"
