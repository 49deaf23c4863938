"""How the console turns data into markup: payload views (JSON, text, binary, cut at a
multi-byte character) and the chart's geometry. No browser needed."""

from __future__ import annotations

from jobfence.ops.ui.render import SHOWN_BYTES, chart, payload_view


def test_json_is_formatted_and_text_kept() -> None:
    view = payload_view(b'{"a":1,"b":"<x>"}')
    assert (view.kind, view.size, view.cut) == ("json", 17, False)
    assert view.text == '{\n  "a": 1,\n  "b": "<x>"\n}'
    text = payload_view("plain text, not JSON: é".encode())
    assert (text.kind, text.text) == ("text", "plain text, not JSON: é")


def test_binary_and_nul_are_hex() -> None:
    view = payload_view(bytes(range(20)))
    assert view.kind == "hex"
    assert view.hex_rows[0] == (
        "00000000",
        "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f",
        "................",
    )
    assert view.hex_rows[1] == ("00000010", "10 11 12 13", "....")
    assert payload_view(b"text\x00with NUL").kind == "hex"
    assert payload_view(b"\xff\xfe").kind == "hex"
    assert payload_view(None).kind == "none"


def test_a_large_payload_is_cut_even_inside_a_character() -> None:
    data = b"a" * (SHOWN_BYTES - 1) + "é".encode() * 10  # é is 2 bytes: cut in the middle
    view = payload_view(data)
    assert (view.kind, view.cut, view.size) == ("text", True, len(data))
    assert view.text == "a" * (SHOWN_BYTES - 1)
    big_binary = payload_view(b"\xff" * (SHOWN_BYTES + 100))
    assert (big_binary.kind, big_binary.cut) == ("hex", True)
    assert len(big_binary.hex_rows) == SHOWN_BYTES // 16


def test_chart_geometry() -> None:
    drawn = chart({0: 10, 59: 5}, {0: 2})
    assert (drawn.peak, drawn.done_total, drawn.failed_total) == (10, 15, 2)
    now, oldest = drawn.bars[-1], drawn.bars[0]
    assert (now.done_h, now.done_y) == (110, 10)
    assert now.fail_h == 22
    assert oldest.done_h == 55
    assert now.label == "0 min ago: 10 done, 2 dead-lettered"
    scoped = chart({}, {3: 4}, show_done=False)
    assert scoped.done_total == 0
    assert scoped.bars[56].label == "3 min ago: 4 dead-lettered"
