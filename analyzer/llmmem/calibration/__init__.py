"""Local calibration: the rows of real runs (`store`), below the budget that reads them."""
