"""Ingest's progress reporting: silent by default (a library call, a Dagster asset or a test must not
get a progress bar on its stderr), a bar on request (the CLI asks for one), and a callback that
sees every file's bytes, ending at the total the bar was sized to."""
import json

from ratchet.ingest import ingest


def _landing(tmp_path, n=3):
    d = tmp_path / "in"
    d.mkdir(parents=True)
    for i in range(n):
        rows = [{"trajectory_id": f"p{i}-{j}", "task_id": "t", "messages": [{"role": "user", "content": "x" * (50 * j)}]}
                for j in range(1, 4)]
        (d / f"f{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d, sum(p.stat().st_size for p in d.iterdir())


def test_ingest_writes_no_progress_bar_unless_asked(wh, tmp_path, capfd):
    d, _ = _landing(tmp_path)
    ingest([d], wh)
    assert "ingest" not in capfd.readouterr().err

    d2, _ = _landing(tmp_path / "second")
    ingest([d2], wh, progress=True)
    err = capfd.readouterr().err
    assert "ingest: 100%" in err, err


def test_a_progress_callback_sees_each_file_and_ends_at_the_total(wh, tmp_path, capfd):
    d, total = _landing(tmp_path, n=3)
    seen = []
    s = ingest([d], wh, progress=lambda done, of: seen.append((done, of)))
    assert s.accepted == 9
    assert len(seen) == 3                                   # once per file read
    assert all(of == total for _, of in seen)
    done = [n for n, _ in seen]
    assert done == sorted(done) and done[0] > 0 and done[-1] == total
    assert "ingest" not in capfd.readouterr().err          # a callback is not a bar
