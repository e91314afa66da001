"""A kernel whose every call raises with text that would act if it were printed or parsed: rich markup
(``[/x]`` closes a tag never opened: rich.errors.MarkupError), an escape sequence that retitles the
terminal, a bidirectional override, and a line that mimics the verdict (issue 53). The laws' and the
search's tables and lines must show it as text."""
from __future__ import annotations

LOUD = "[/x] [bold]bold?[/bold] \x1b]0;pwned\x07 \u202e -> OK"


class LoudKernel:
    name = "loud [/x]"
    codec = None

    def paged_attention_fp8(self, *args, **kwargs):
        raise RuntimeError(LOUD)

    def qk_matmul_scale(self, *args, **kwargs):
        raise RuntimeError(LOUD)


def make() -> LoudKernel:
    return LoudKernel()
