/* config.h for run/check-v100: gpu/ includes it; the device compile needs nothing from it */
