"""The queue walk: admission passes over every region's queue, asked for when capacity may have grown."""
