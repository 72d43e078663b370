#ifndef CONFIG_H
#define CONFIG_H
#define GREETING "Hello"
#define VERSION "1.0"
#endif
