"""Small descriptive statistics over lists of numbers."""


def mean(values):
    """Arithmetic mean; raises ValueError on an empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    """Middle value of the sorted list (the mean of the two middle values for even lengths)."""
    if not values:
        raise ValueError("median of an empty list")
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle]


def spread(values):
    """Largest minus smallest value."""
    if not values:
        raise ValueError("spread of an empty list")
    return max(values) - min(values)
