"""The console's and the dashboard's commands without a console: named errors, not tracebacks."""

from smlt.cli import main


def test_down_and_dashboard_without_a_console_say_so(tmp_path, capsys):
    assert main(["local", "down", "--state", str(tmp_path)]) == 2
    assert f"no console is up with --state {tmp_path}" in capsys.readouterr().err
    assert main(["dashboard", "--local", "--state", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--local: no console is up" in err and "smlt local up" in err and "Traceback" not in err


def test_dashboard_names_an_endpoint_it_cannot_reach(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert main(["dashboard", "--endpoint-url", "http://127.0.0.1:9"]) == 1  # nothing listens on port 9
    assert "cannot reach http://127.0.0.1:9: is the local console up" in capsys.readouterr().err


def test_a_command_against_an_endpoint_that_is_down_names_it(capsys, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert main(["status", "some-run"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:9" in err and "smlt local up" in err and "Traceback" not in err
