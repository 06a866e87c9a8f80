"""An existing ``callback(message)`` made exactly-once by adding one line."""
