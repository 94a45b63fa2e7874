"""A stand-in for the parts of vLLM that kvtier's connector touches, at vLLM's module paths.

Written for kvtier's tests from reading vLLM's source; it holds the names
``kvtier_vllm.connector`` imports or calls, with the behaviour vLLM gives them, and nothing
else. Which vLLM is modelled is chosen at run time (:mod:`vllm._twin`): the two modelled
revisions differ in the layout helper, the worker's transfer-result hook and the connector
output's fields.
"""
