"""`precaudit test RULES_DIR`: every rule's own examples, run and compared, rule by rule (Semgrep's --test).

A rule's examples are the `tests:` of its YAML file (an ONNX model in the rule folder, check's options, the nodes
where the rule must fire: none for a quiet twin; examples.py checks them all before anything runs) and, with
--fixtures DIR --allow-code, the CASES of its Python fixture module DIR/ID_name.py (fixtures.py; case.py is their
Case), compared exactly as the project's own tests compare them. run.py runs each through the command line, in this
process, into a folder of its own, and says what is wrong; render.py prints the verdicts as text or JSON.

The command line is handed in (run.Commands) by the grammar, which nothing imports: the engine never imports it.
"""
