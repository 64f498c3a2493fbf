"""The two function schemas the tool-calling checks share: a call needs
both arguments, each bounded so a random-weight model's forced call ends."""

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
