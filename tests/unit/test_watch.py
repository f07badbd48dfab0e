"""smlt run --local --watch: a version's marker written again starts a new run."""

import os
from pathlib import Path
from types import SimpleNamespace

import smlt.watch as watch


def test_a_marker_written_again_is_uploaded_again(tmp_path, monkeypatch):
    root = tmp_path / "w"
    marker = root / "incoming" / "houses" / "v2" / "_SUCCESS"
    marker.parent.mkdir(parents=True)
    (marker.parent / "data.csv").write_text("x,label\n1,a\n")
    marker.touch()
    os.utime(marker, ns=(1_000_000_000, 1_000_000_000))
    uploads: list[Path] = []

    class Trigger:
        def __init__(self, engine, bucket):
            pass

        def prime(self):
            pass

    def upload_version(trigger, folder, root, last):
        uploads.append(folder / last)
        if len(uploads) == 1:  # the team fixes the data and uploads the marker again
            os.utime(marker, ns=(2_000_000_000, 2_000_000_000))
        return [f"arn-{len(uploads)}"]

    monkeypatch.setattr(watch, "UploadTrigger", Trigger)
    monkeypatch.setattr(watch, "upload_version", upload_version)
    monkeypatch.setattr(watch, "_follow_triggered", lambda *a: None)
    names = SimpleNamespace(data_bucket="data")
    started = watch.watch_folder(None, names, root, tmp_path / "out", once=True, interval=0)
    # uploaded again once, then a pass finds it unchanged and the watch (once) ends
    assert started == ["arn-1", "arn-2"] and uploads == [marker, marker]
