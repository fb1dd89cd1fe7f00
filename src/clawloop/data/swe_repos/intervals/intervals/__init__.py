"""intervals: half-open numeric intervals and inclusive date ranges."""

from intervals.dates import DateRange, add_months, days_in_month, is_leap_year
from intervals.interval import Interval
from intervals.ops import free_slots, gaps, merge, subtract, total_length

__all__ = ["DateRange", "add_months", "days_in_month", "is_leap_year", "Interval", "free_slots", "gaps", "merge",
           "subtract", "total_length"]
