"""Structured outputs: a request's grammar (a JSON schema, any JSON, a regex, a choice, an EBNF grammar) applied
as a token mask at sampling, through xgrammar (vLLM's and SGLang's default grammar engine).

:mod:`.spec` says what a request asks for (pure data, torch-free); :mod:`.compiler` compiles it for the served
tokenizer, off the event loop, with compiled grammars cached by spec; :mod:`.constraint` is one sequence's
matcher: the sampler asks it to mask a row of logits and tells it the token drawn.
"""
