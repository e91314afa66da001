"""A backend whose every string is hostile text (tests/cases/test_text_is_data.py): its name, notes, skip
reasons, exception messages and printed output hold terminal escape sequences (an OSC that retitles the
window; a carriage return, erase-line and a fake "-> OK"), rich markup (``[/x]``, ``[bold]``), HTML, a
bidirectional override and a lone surrogate.

Its kernel prints that text, then raises it on a batch of one, and ends its process (``os._exit(3)``)
on any other batch; cases with two or more KV heads it skips, with that text as the reason.
"""
import os
import types

from pfa_verify import golden

#: What a terminal would act on, what rich and a browser would parse: everything but the surrogate.
PRINTED = "\x1b]0;pwned\x07[bold]b[/bold] [/x] <b>h</b> \u202eevil\r\x1b[2K-> OK"
#: PRINTED and a lone surrogate (what os.fsdecode makes of a stray byte): it cannot be encoded at all.
EVIL = PRINTED + " \udcff"


class Hostile:
    name = "hostile " + EVIL
    codec = None

    def notes(self):
        return ["note " + EVIL]

    def skip_reason(self, config):
        if config.nkv >= 2:
            return types.SimpleNamespace(kind="unsupported", reason="skip " + EVIL)
        return None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        print("printed " + PRINTED, flush=True)
        if block_table.shape[0] == 1:
            raise RuntimeError("raised " + EVIL)
        os._exit(3)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Hostile()
