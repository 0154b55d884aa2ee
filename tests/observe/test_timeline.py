from asyncrl.observe.timeline import Timeline, read_timelines


def test_close_spans_merge_and_kinds_stay_apart(tmp_path):
    t = Timeline(tmp_path, "generator-0", merge_gap_s=0.01)
    t.record("generate", 0.0, 1.0)
    t.record("generate", 1.005, 2.0)  # within the gap: merged
    t.record("generate", 3.0, 4.0)
    t.record("push", 1.0, 1.5)
    t.close()
    spans = [(s["kind"], s["start"], s["end"]) for s in read_timelines(tmp_path)]
    assert sorted(spans) == [("generate", 0.0, 2.0), ("generate", 3.0, 4.0), ("push", 1.0, 1.5)]


def test_torn_last_line_is_skipped(tmp_path):
    t = Timeline(tmp_path, "x")
    t.record("train", 0.0, 1.0)
    t.close()
    with open(tmp_path / "timeline" / "x.jsonl", "a") as f:
        f.write('{"name": "x", "kind": "tr')
    assert len(read_timelines(tmp_path)) == 1
