"""A custom sample-logging predicate, named by import path in tests."""


def long_response(sample: dict) -> bool:
    return sample["response_len"] >= 3
