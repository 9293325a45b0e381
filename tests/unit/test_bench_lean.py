"""The benchmark's lean client encodes and reads messages as proton does (bench/lean.py)."""

import pytest
from proton import Message

from bench import lean


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("group_as_subject", [False, True])
def test_an_encoded_bench_message_decodes_with_proton_to_the_same_fields(durable, group_as_subject):
    encoder = lean.MessageEncoder(body_bytes=100, durable=durable, group_as_subject=group_as_subject)

    message = Message()
    message.decode(encoder.encode("g0042", 123_456_789_012, 7))

    assert message.group_id == "g0042"
    assert message.subject == ("g0042" if group_as_subject else None)
    assert message.durable is durable
    assert message.properties == {"bench_sent_ns": 123_456_789_012, "bench_seq": 7}
    assert bytes(message.body) == b"x" * 100


def test_the_reader_gets_group_seq_and_send_time_back_from_the_encoder():
    encoder = lean.MessageEncoder(body_bytes=100, durable=True, group_as_subject=False)

    assert lean.read_fields(encoder.encode("g0001", 5_000_000_000, 3)) == ("g0001", 3, 5_000_000_000)


def test_the_reader_reads_what_proton_encodes_with_annotations_and_other_properties():
    message = Message(body="hello", group_id="orders-17", durable=True, subject="s", id="m-1", ttl=30,
                      properties={"other": "x", "bench_seq": 12, "bench_sent_ns": 2**40, "more": 1.5})
    message.annotations = {"x-opt-enqueued-time": 1_700_000_000_000}

    assert lean.read_fields(message.encode()) == ("orders-17", 12, 2**40)


def test_a_message_without_the_bench_fields_reads_as_missing():
    assert lean.read_fields(Message(body=b"raw").encode()) == (None, -1, 0)


# ---- the command line's security flags ----------------------------------------------------------

def target_of(*argv):
    parse = lean.parser()
    return lean.target_from_args(parse.parse_args(["--queue", "q", *argv]), parse)


def refused_flags(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        target_of(*argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "password"
    path.write_text("s3cret\n")
    return str(path)


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory):
    from node import certs

    directory = tmp_path_factory.mktemp("ca")
    return str(certs.make_ca(directory)[0])


def test_without_security_flags_the_target_is_anonymous_and_clear():
    target = target_of("--url", "127.0.0.1:5672")
    assert (target.url, target.user, target.password, target.tls, target.ca_file) == \
        ("amqp://127.0.0.1:5672", "", "", False, "")
    assert lean.credentials(target) == ("", "")


def test_user_and_password_file_give_plain_credentials_without_the_trailing_newline(password_file, ca_file):
    target = target_of("--url", "broker.example:5671", "--user", "bench", "--password-file", password_file,
                       "--ca", ca_file)
    assert lean.credentials(target) == ("bench", "s3cret")
    assert target.tls and target.ca_file == ca_file, "--ca implies --tls"


def test_tls_without_ca_uses_the_systems_cas():
    target = target_of("--url", "broker.example:5671", "--tls")
    assert target.tls and target.ca_file == ""


def test_a_password_without_tls_is_refused_for_a_broker_off_this_host(capsys, password_file):
    assert "unencrypted" in refused_flags(capsys, "--url", "broker.example:5672", "--user", "u",
                                          "--password-file", password_file)


def test_a_password_without_tls_is_allowed_to_a_loopback_broker(password_file):
    assert lean.credentials(target_of("--url", "127.0.0.1:5672", "--user", "u", "--password-file", password_file)) \
        == ("u", "s3cret")


def test_a_user_needs_a_password_file_and_a_password_file_a_user(capsys, password_file):
    assert "--password-file" in refused_flags(capsys, "--url", "127.0.0.1:5672", "--user", "u")
    assert "--user" in refused_flags(capsys, "--url", "127.0.0.1:5672", "--password-file", password_file)


def test_unreadable_files_are_refused_naming_the_flag(capsys, tmp_path, password_file):
    assert "--password-file" in refused_flags(capsys, "--url", "127.0.0.1:5672", "--user", "u",
                                              "--password-file", str(tmp_path / "missing"))
    assert "--ca" in refused_flags(capsys, "--url", "127.0.0.1:5671", "--ca", password_file)


def test_credentials_in_the_url_are_refused_on_the_command_line(capsys):
    assert "--user" in refused_flags(capsys, "--url", "amqp://u:p@127.0.0.1:5672")


def test_rabbitmqs_url_credentials_still_reach_sasl():
    from bench.peers import Target

    assert lean.credentials(Target("amqp", "amqp://guest:guest@127.0.0.1:5672", "q", ())) == ("guest", "guest")


def test_an_endpoint_refuses_plain_without_tls_to_a_broker_off_this_host():
    from bench.peers import Target

    target = Target("amqp", "amqp://192.0.2.1:5672", "q", (), user="u", password="p")
    with pytest.raises(lean.LeanError, match="unencrypted"):
        lean.connect(target, "test", None)
