"""Every command-line error of `worker` is one line, exit 2, and names what is accepted
(issue 33 item 5): nothing is served, no traceback. Loopback only."""
import socket

import pytest

from comfyui_placement import cli

SECRET_ENV = "COMFYUI_PLACEMENT_SECRET"


def run(capsys, *args):
    code = cli.main(["worker", *args])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.fixture
def models(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "s3cret")
    return str(tmp_path)


@pytest.mark.parametrize("listen, words", [
    ("127.0.0.1:99999", "port 99999 is past 65535"),
    ("127.0.0.1:abc", "expected HOST:PORT"),
    ("7860", "expected HOST:PORT"),
])
def test_a_bad_listen_address_is_one_line(capsys, models, listen, words):
    code, err = run(capsys, "--listen", listen, "--models", models)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("placement error:") and words in err, err


def test_a_port_in_use_is_one_line(capsys, models):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, err = run(capsys, "--listen", f"127.0.0.1:{port}", "--models", models)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "port 0 picks" in err, err


def test_a_models_folder_that_is_not_one_is_one_line(capsys, models, tmp_path):
    not_a_folder = tmp_path / "file.txt"
    not_a_folder.write_text("x")
    for where in (str(not_a_folder), str(tmp_path / "missing")):
        code, err = run(capsys, "--listen", "127.0.0.1:0", "--models", where)
        assert code == 2 and len(err.splitlines()) == 1 and "is not a folder" in err, err


def test_a_missing_secret_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    code, err = run(capsys, "--listen", "127.0.0.1:0", "--models", str(tmp_path))
    assert code == 2 and len(err.splitlines()) == 1 and "no shared secret" in err, err


def test_a_wrong_comfyui_folder_is_one_line(capsys, models, tmp_path):
    code, err = run(capsys, "--listen", "127.0.0.1:0", "--models", models,
                    "--comfyui", str(tmp_path))
    assert code == 2 and len(err.splitlines()) == 1 and "is not a ComfyUI folder" in err, err
    code, err = run(capsys, "--listen", "127.0.0.1:0", "--models", models,
                    "--comfyui-args=--fp16-unet")
    assert code == 2 and "--comfyui-args needs --comfyui PATH" in err, err
